//! The crate's error type: everything that can go wrong starting, talking to or stopping reactors.

use std::io;

/// Errors from the reactor runtime.
#[derive(Debug, thiserror::Error)]
pub enum PollerError {
    /// The configuration lists no cores, so there would be no reactor at all.
    #[error("no cores configured: a runtime needs at least one reactor core")]
    NoCores,

    /// A configured core does not exist or is outside this process' CPU affinity mask.
    #[error(
        "core {core} does not exist or is not available to this process (available cores: {})",
        core_list(.available)
    )]
    NoSuchCore {
        /// The core that was asked for.
        core: usize,
        /// The cores this process may run on.
        available: Vec<usize>,
    },

    /// The same core is configured twice (two reactors would fight over one core).
    #[error("core {core} is configured more than once")]
    DuplicateCore {
        /// The repeated core.
        core: usize,
    },

    /// The operating system would not tell which cores this process may use.
    #[error("cannot list the cores available to this process (sched_getaffinity failed)")]
    CoreQueryFailed,

    /// Pinning the reactor thread to its core failed.
    #[error("could not pin reactor {reactor} to core {core}")]
    PinFailed {
        /// Reactor index.
        reactor: usize,
        /// Core it should have been pinned to.
        core: usize,
    },

    /// The reactor has exited (stopped or panicked); it no longer takes messages.
    #[error("reactor {reactor} has stopped")]
    ReactorStopped {
        /// Reactor index.
        reactor: usize,
    },

    /// The reactor thread panicked; its join returned an error.
    #[error("reactor {reactor} panicked")]
    ReactorPanicked {
        /// Reactor index.
        reactor: usize,
    },

    /// A bounded call got no answer in time (the reactor is busy in one pass or hung).
    #[error("reactor {reactor} did not answer within {waited:?}")]
    NoAnswer {
        /// Reactor index.
        reactor: usize,
        /// How long the caller waited.
        waited: std::time::Duration,
    },

    /// A blocking call was made from the reactor's own thread, which would wait forever.
    #[error("blocking call to reactor {reactor} from its own thread would deadlock")]
    WouldDeadlock {
        /// Reactor index.
        reactor: usize,
    },

    /// Setting up a reactor (epoll instance, wake-up eventfd, thread) failed.
    #[error("setting up reactor {reactor}: {source}")]
    Io {
        /// Reactor index.
        reactor: usize,
        /// The underlying OS error.
        #[source]
        source: io::Error,
    },
}

/// "0, 1, 2" for error messages.
fn core_list(cores: &[usize]) -> String {
    let list: Vec<String> = cores.iter().map(ToString::to_string).collect();
    if list.is_empty() {
        "none".to_owned()
    } else {
        list.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_such_core_names_core_and_available_ones() {
        let e = PollerError::NoSuchCore {
            core: 7,
            available: vec![0, 1],
        };
        assert_eq!(
            e.to_string(),
            "core 7 does not exist or is not available to this process (available cores: 0, 1)"
        );
    }
}
