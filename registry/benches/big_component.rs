//! The plugin the install benchmarks move: the bundled echo-tool component grown to 5 MiB.

const SIZE: usize = 5 * 1024 * 1024;

/// The bundled echo-tool component grown to 5 MiB with a trailing custom section.
pub fn big_component() -> Vec<u8> {
    let mut bytes = keel_bundled_plugins::get("echo-tool")
        .map(|b| b.component())
        .expect("echo-tool is bundled");
    let name = b"padding";
    let payload = SIZE - bytes.len() - 16;
    let mut section = Vec::new();
    let mut size = (1 + name.len() + payload) as u64;
    bytes.push(0); // custom section id
    loop {
        let byte = (size & 0x7f) as u8;
        size >>= 7;
        if size == 0 {
            section.push(byte);
            break;
        }
        section.push(byte | 0x80);
    }
    bytes.extend(section);
    bytes.push(name.len() as u8);
    bytes.extend(name);
    bytes.resize(bytes.len() + payload, 0xa5);
    bytes
}
