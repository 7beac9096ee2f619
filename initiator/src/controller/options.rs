//! What the host asks for when it attaches a controller, and the reconnect policy
//! (nvme-cli's --reconnect-delay, --ctrl-loss-tmo, --fast_io_fail_tmo).

use std::time::Duration;

use crate::admin::DataPlacement;

/// What to do after the connection is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconnectPolicy {
    /// Wait between reconnect attempts (nvme-cli default 10 s).
    pub reconnect_delay: Duration,
    /// Give the controller up this long after the loss; `None` = retry forever
    /// (nvme-cli --ctrl-loss-tmo=-1), zero = never reconnect. nvme-cli default 600 s.
    pub ctrl_loss_timeout: Option<Duration>,
    /// Blocking requests submitted while reconnecting wait at most this long, then fail;
    /// `None` = wait until the controller is back or given up.
    pub fast_io_fail: Option<Duration>,
}

impl Default for ReconnectPolicy {
    fn default() -> Self {
        Self {
            reconnect_delay: Duration::from_secs(10),
            ctrl_loss_timeout: Some(Duration::from_secs(600)),
            fast_io_fail: None,
        }
    }
}

impl ReconnectPolicy {
    /// No reconnect: the first loss fails the controller.
    pub fn never() -> Self {
        Self {
            reconnect_delay: Duration::ZERO,
            ctrl_loss_timeout: Some(Duration::ZERO),
            fast_io_fail: Some(Duration::ZERO),
        }
    }
}

/// Host parameters of one controller attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerOptions {
    /// Subsystem NQN to attach (the discovery NQN for a discovery controller).
    pub subnqn: String,
    /// This host's NQN.
    pub hostnqn: String,
    /// This host's identifier.
    pub hostid: [u8; 16],
    /// Keep Alive Timeout sent on the admin connect (zero disables keep-alive). The Linux host
    /// sends 5 s plus 10 s grace.
    pub kato: Duration,
    /// I/O queues wanted (the controller may grant fewer).
    pub io_queues: u16,
    /// I/O queue depth wanted (capped by CAP.MQES + 1, MAXCMD and the target's grant).
    pub io_queue_depth: u16,
    /// Admin queue depth (the Linux host uses 32).
    pub admin_queue_depth: u16,
    /// How the 1024-byte Connect data travels (Linux: keyed SGL).
    pub connect_data: DataPlacement,
    /// Largest data transfer per command the host wants (also capped by MDTS).
    pub max_io_size: usize,
    /// Registered data memory per I/O queue. `None`: a largest transfer for every command
    /// (queue depth x the largest transfer: 16 MiB at depth 128 and 128 KiB, pinned on an
    /// RDMA device). Less than that: the commands in flight share it by their own transfer
    /// sizes, and a submission that finds no room fails with [`crate::Error::QueueFull`] until
    /// completions free some (at least one largest transfer is always registered).
    pub io_queue_data_size: Option<usize>,
    /// Send small writes in the capsule when the target allows it.
    pub in_capsule_data: bool,
    /// Give each I/O's data its own short-lived key (memory window) where the transport has
    /// them, instead of the queue region's long-lived key.
    pub per_io_keys: bool,
    /// Admin command timeout.
    pub admin_timeout: Duration,
    /// I/O command timeout (zero = none): an older command fails the connection.
    pub io_timeout: Duration,
    /// Reconnect policy.
    pub reconnect: ReconnectPolicy,
}

impl ControllerOptions {
    /// Options for `subnqn` with defaults like the Linux host's.
    pub fn new(subnqn: impl Into<String>, hostnqn: impl Into<String>, hostid: [u8; 16]) -> Self {
        Self {
            subnqn: subnqn.into(),
            hostnqn: hostnqn.into(),
            hostid,
            kato: Duration::from_secs(15),
            io_queues: 1,
            io_queue_depth: 128,
            admin_queue_depth: 32,
            connect_data: DataPlacement::Keyed,
            max_io_size: 128 * 1024,
            io_queue_data_size: None,
            in_capsule_data: true,
            per_io_keys: false,
            admin_timeout: Duration::from_secs(30),
            io_timeout: Duration::from_secs(30),
            reconnect: ReconnectPolicy::default(),
        }
    }
}
