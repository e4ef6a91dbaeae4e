//! `gateway-control-plane`: migrations first, then it listens (logging
//! `control plane listening on <addr>` to stderr); SIGTERM or SIGINT stops it gracefully.

use gateway_control_plane::{api, AppState, Settings};
use std::process::ExitCode;

fn main() -> ExitCode {
    heap::bound();
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
        .and_then(|runtime| runtime.block_on(run()));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gateway-control-plane: {e}");
            ExitCode::FAILURE
        }
    }
}

/// glibc's allocator gives each thread that allocates an arena of its own (up to eight per
/// core; here the runtime's threads and one per SQLite connection) and keeps what is freed in
/// each: in a ten-million-request soak the heap held twice what was in use, and grew in steps
/// (bench/README.md, "The control plane's memory"). Two arenas, and free pages handed back to
/// the system every few seconds (a trim of this heap takes well under a millisecond), keep the
/// resident memory to what is in use.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod heap {
    const ARENAS: libc::c_int = 2;
    const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

    /// Before any other thread starts: the arena limit applies to threads started after it.
    pub fn bound() {
        // SAFETY: `mallopt` changes an allocator setting; called once, from the only thread.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, ARENAS) };
    }

    pub async fn trim() {
        let mut every = tokio::time::interval(TRIM_EVERY);
        loop {
            every.tick().await;
            // SAFETY: `malloc_trim` only returns free pages of the allocator's to the system.
            unsafe { libc::malloc_trim(0) };
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod heap {
    pub fn bound() {}
    pub async fn trim() {}
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
    tokio::spawn(heap::trim());
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
