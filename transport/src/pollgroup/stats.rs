//! Poll-group counters. Owned and written by the group's reactor only; others read a copy.

/// What a poll group has seen since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollGroupStats {
    /// CQ polls, and polls that found nothing.
    pub polls: u64,
    pub idle_polls: u64,
    /// Completions reaped.
    pub completions: u64,
    /// Capsules handed up to the layer above.
    pub capsules: u64,
    /// Receive completions for a qp_num not in the tree (the qpair is gone); slot re-posted.
    pub orphans: u64,
    /// Receives that arrived for a draining qpair; slot re-posted.
    pub discarded: u64,
    /// Capsules that waited for a free request object.
    pub queued_for_request: u64,
    /// Hosts that sent more commands than the negotiated depth (each one disconnected).
    pub overruns: u64,
    /// Error completions (flushes included).
    pub error_completions: u64,
    /// Qpairs added, and qpairs gone (drained and destroyed).
    pub qpairs_added: u64,
    pub qpairs_gone: u64,
    /// Drains that ended by LAST_WQE_REACHED, by flush accounting (devices without it), or by
    /// the drain timeout.
    pub drained_last_wqe: u64,
    pub drained_flush: u64,
    pub drained_timeout: u64,
    /// qp_num -> qpair lookups: one per receive completion, plus control-path calls.
    pub tree_lookups: u64,
    /// Those of them that walked the RB-tree (its cache in front did not hold the qp_num).
    pub tree_walks: u64,
    /// Completions dropped because their request or qpair generation was stale (the object
    /// was reused or is gone).
    pub stale_completions: u64,
    /// Completions whose opcode does not fit their wr_id's kind (dropped).
    pub kind_mismatches: u64,
    /// Receive completions for a slot that was not posted (dropped, slot left alone).
    pub recv_slot_errors: u64,
    /// LAST_WQE_REACHED for a qpair that is neither draining nor in ERR (ignored).
    pub last_wqe_ignored: u64,
    /// End-of-poll posts that stopped at a chain without send-queue or RDMA READ room (it
    /// waits in its qpair's FIFO).
    pub post_stalls: u64,
    /// Requests that waited for data buffers.
    pub buffer_waits: u64,
    /// Requests aborted because their qpair went.
    pub requests_aborted: u64,
    /// Send-side post calls, and WRs posted by them.
    pub send_post_calls: u64,
    pub send_wrs_posted: u64,
    /// Of those calls, lists posted with `post_send_more` (another list to the same QP followed
    /// at once; its post transmits both).
    pub send_lists_held: u64,
    /// Chains posted without a completion of their own (a later chain of the same list, or of
    /// a later list, asks for one), and such chains retired by a later completion on their
    /// qpair.
    pub silent_chains: u64,
    pub silent_retired: u64,
    /// Of the silent chains, lists' last chains (lone answers: `silent.rs`).
    pub silent_lone: u64,
    /// Zero-length RDMA WRITEs posted to retire a quiet qpair's silent chains.
    pub silent_flushes: u64,
    /// Receive slots re-posted to the SRQ, and post calls (lists) used for them.
    pub recvs_posted: u64,
    pub recv_post_calls: u64,
}
