//! The registry over HTTP on loopback: the same publish, install and refusals as a directory.

use crate::common;

use std::net::SocketAddr;

use common::{Fixture, R, component, manifest, message};
use keel_registry::{
    Home, InstallOptions, LocalRegistry, PluginName, Registry, ServeOptions, Session, TrustConfig,
    apply_install, check_bind_address, load_installed, parse_spec, plan_install, publish,
    spawn_server, yank,
};

fn loopback() -> Result<SocketAddr, std::net::AddrParseError> {
    "127.0.0.1:0".parse()
}

#[test]
fn publish_and_install_over_http() -> R {
    let fx = Fixture::new()?;
    let local = LocalRegistry::open(&fx.registry_path(), false)?;
    let server = spawn_server(
        local,
        loopback()?,
        ServeOptions {
            validator: Some(fx.host.clone()),
        },
    )?;
    let url = server.url();

    // Publish through the server.
    let package = fx.package(&manifest("echo", "0.1.0", ""), component("0.1.0"))?;
    let name: PluginName = "acme:echo".parse()?;
    let mut session = Session::new(fx.publisher.clone(), Registry::open(&url, false)?)?;
    publish(&mut session, &name, &package, Some(&fx.key), &mut |_| {})?;
    let package = fx.package(&manifest("echo", "0.2.0", ""), component("0.2.0"))?;
    publish(&mut session, &name, &package, Some(&fx.key), &mut |_| {})?;
    let err = message(publish(
        &mut session,
        &name,
        &package,
        Some(&fx.key),
        &mut |_| {},
    ));
    assert!(err.contains("already published"), "{err}");
    yank(&mut session, &name, &"0.2.0".parse()?, Some(&fx.key))?;
    // The server wrote into the directory.
    assert_eq!(
        std::fs::read_to_string(fx.registry_path().join("index/acme/echo.jsonl"))?
            .lines()
            .count(),
        3
    );

    // Install through the server into a home whose namespace is bound to the URL.
    let home = Home::new(fx.dir.path().join("user"));
    let mut trust = TrustConfig::default();
    trust.trust("acme", fx.key.public(), &url)?;
    trust.save(&home.trust_path())?;
    let mut session = Session::new(home.clone(), Registry::open(&url, false)?)?;
    let plan = plan_install(
        &mut session,
        &[parse_spec("acme:echo")?],
        InstallOptions::default(),
    )?;
    session.finish()?;
    assert_eq!(
        plan.plugins[0].version.to_string(),
        "0.1.0",
        "0.2.0 is yanked"
    );
    apply_install(&home, &plan)?;
    assert_eq!(load_installed(&home)?[0].entry.registry, url);

    // The directory path is a different registry as far as the binding goes.
    let mut session = Session::new(home.clone(), fx.registry()?)?;
    let err = message(plan_install(
        &mut session,
        &[parse_spec("acme:echo")?],
        InstallOptions::default(),
    ));
    assert!(err.contains(&format!("--registry {url}")), "{err}");

    // A blob altered on the server's disk is refused by the client.
    let sha = plan.plugins[0].release.sha256.clone();
    std::fs::write(
        fx.registry_path()
            .join("blobs/sha256")
            .join(&sha[..2])
            .join(&sha),
        b"not the plugin",
    )?;
    let other = Home::new(fx.dir.path().join("other"));
    trust.save(&other.trust_path())?;
    let mut session = Session::new(other, Registry::open(&url, false)?)?;
    let err = message(plan_install(
        &mut session,
        &[parse_spec("acme:echo")?],
        InstallOptions::default(),
    ));
    assert!(err.contains(&sha) && err.contains("got "), "{err}");
    Ok(())
}

#[test]
fn the_server_refuses_what_a_local_publish_would() -> R {
    let fx = Fixture::new()?;
    let server = spawn_server(
        LocalRegistry::open(&fx.registry_path(), false)?,
        loopback()?,
        ServeOptions::default(),
    )?;
    let client = reqwest::blocking::Client::new();
    // A blob whose bytes do not match its name.
    let response = client
        .put(format!("{}/blobs/sha256/{}", server.url(), "ab".repeat(32)))
        .body("hello")
        .send()?;
    assert_eq!(response.status().as_u16(), 422);
    assert!(response.text()?.contains("hashes to"));
    // A record that is not canonical.
    let response = client
        .post(format!("{}/index/acme:echo", server.url()))
        .body("{ }")
        .send()?;
    assert_eq!(response.status().as_u16(), 422);
    // Unknown plugin: 404, which the client reads as an empty index.
    let response = client
        .get(format!("{}/index/acme:nothing", server.url()))
        .send()?;
    assert_eq!(response.status().as_u16(), 404);
    Ok(())
}

#[test]
fn binding_beyond_loopback_needs_the_explicit_flag() -> R {
    let public: SocketAddr = "0.0.0.0:7878".parse()?;
    let err = message(check_bind_address(public, false));
    assert!(err.contains("--expose-registry-to-network"), "{err}");
    assert!(err.contains("publish"), "{err}");
    assert!(check_bind_address(public, true).is_ok());
    assert!(check_bind_address("[::1]:7878".parse()?, false).is_ok());
    Ok(())
}
