//! `keel web`: the runtime on a local page without a session of its own: the plugins a
//! session of this config loads, as a live graph, and every session's log as a timeline.
//! `keel run --web` (or `/web`) serves a live session the same way.

use std::io::Write as _;
use std::process::ExitCode;

use crate::config::Context;
use crate::runtime::{self, Runtime};

/// `keel web …`
#[derive(clap::Args, Debug)]
pub struct WebArgs {
    /// The port on 127.0.0.1 (any free one by default).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Do not open a browser; only print the URL.
    #[arg(long)]
    pub no_open: bool,
}

pub async fn run(ctx: &Context, args: WebArgs) -> anyhow::Result<ExitCode> {
    crate::session::handle_stop_signals();
    let rt = Runtime::new(ctx)?;
    let sources = runtime::session_plugins(ctx, &rt.loader)?;
    runtime::say_if_compiling(&rt.loader, &sources);
    for prepared in runtime::prepare(&rt.loader, sources) {
        let mut package = prepared.package?;
        runtime::apply_user_config(&ctx.config.config, &mut package)?;
        rt.kernel.load(package).await?;
    }
    let served = crate::web::serve(
        crate::web::Sources {
            kernel: rt.kernel.clone(),
            live: None,
            logs: Some(ctx.data_dir().join("sessions")),
        },
        &crate::web::Options {
            port: args.port,
            open: !args.no_open,
        },
    )
    .await?;
    stdoutln!("{}", served.url()?);
    std::io::stdout().flush()?;
    stderrln!(
        "keel's page for {}: open the URL above (Ctrl-C stops it). `keel run --web` serves a \
         live session.",
        ctx.workspace.display()
    );
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = crate::session::terminated() => {}
    }
    drop(served);
    if let Err(e) = rt.kernel.shutdown().await {
        stderrln!("warning: {e}");
    }
    Ok(ExitCode::SUCCESS)
}
