//! The soft CM's threads over TCP (a listener's accept loop, each connection's reader on either
//! side): spawned here with their handles kept, and joined once finished. A detached thread that
//! ended is not yet gone (its handle, stack and TLS are freed as it exits, on its own time); a
//! joined one is. Each spawn joins the threads that finished since the last, so the list stays as
//! long as the threads that run; a fuzz harness waits here for its connections' threads to be
//! gone before the leak checker looks (`join_finished`).

use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Stack of a CM thread (they parse small messages).
const STACK: usize = 128 * 1024;

static THREADS: Mutex<Vec<JoinHandle<()>>> = Mutex::new(Vec::new());

fn threads() -> MutexGuard<'static, Vec<JoinHandle<()>>> {
    THREADS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Joins the threads of `list` that finished.
fn join_ended(list: &mut Vec<JoinHandle<()>>) {
    let mut i = 0;
    while i < list.len() {
        if list[i].is_finished() {
            // A CM thread's panic was reported by the panic hook already.
            let _ = list.swap_remove(i).join();
        } else {
            i += 1;
        }
    }
}

/// Starts a CM thread named `name` running `body`.
pub(super) fn spawn(name: &str, body: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    let handle = std::thread::Builder::new()
        .name(name.into())
        .stack_size(STACK)
        .spawn(body)?;
    let mut list = threads();
    join_ended(&mut list);
    list.push(handle);
    Ok(())
}

/// Joins every CM thread that finished, waiting up to `patience` until at most `keep` run (the
/// threads of connections that stay); how many run then.
pub fn join_finished(keep: usize, patience: std::time::Duration) -> usize {
    let deadline = std::time::Instant::now() + patience;
    loop {
        let running = {
            let mut list = threads();
            join_ended(&mut list);
            list.len()
        };
        if running <= keep || std::time::Instant::now() >= deadline {
            return running;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}
