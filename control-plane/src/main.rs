//! `gateway-control-plane`: migrations first, then it listens (logging
//! `control plane listening on <addr>` to stderr); SIGTERM or SIGINT stops it gracefully.

use gateway_control_plane::{api, AppState, Settings};
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gateway-control-plane: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let settings = Settings::from_env()?;
    let retention_days = gateway_control_plane::retention::days_from_env()?;
    let state = AppState::open(&settings).await?;
    let listener = tokio::net::TcpListener::bind(&settings.addr)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", settings.addr))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    // Unfinished managed batches resume now, and those of a control plane that stopped once
    // their lease expired.
    tokio::spawn(gateway_control_plane::batches::sweep(state.clone()));
    tokio::spawn(gateway_control_plane::retention::sweep(state.clone(), retention_days));
    eprintln!("control plane listening on {addr}");
    axum::serve(listener, api::router(state.clone()))
        .with_graceful_shutdown(shutdown())
        .await
        .map_err(|e| format!("server: {e}"))?;
    state.db.close().await;
    eprintln!("control plane stopped");
    Ok(())
}

async fn shutdown() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(_) => {
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
