//! The sending side of one read transfer, as a sans-I/O state machine.
//!
//! This module owns option negotiation ([`negotiate`]) and the [`Transfer`] state machine: which
//! packet to send next, what an ACK means, when to retransmit, and when the transfer is over. It
//! does no I/O and reads no clock: the caller feeds [`Event`]s (an ACK, a client ERROR, a
//! retransmission timeout) and performs the [`Action`]s it gets back. DATA actions name a byte
//! range of the file ([`DataBlock`]) rather than carrying bytes, so the adapter reads the file
//! however suits it and tests use an in-memory buffer.
//!
//! Behaviour, with the reasons:
//! - **OACK phase.** When options were accepted the OACK is "block 0": ACK 0 confirms it and
//!   starts the data. A client ERROR here (UEFI firmware sends ERROR 8 after reading `tsize`)
//!   ends the transfer at once and sends nothing more, which is exactly what async-tftp got
//!   wrong.
//! - **Windows (RFC 7440).** Up to `windowsize` blocks are in flight. An ACK for block n
//!   acknowledges every block up to n; the next window starts at n + 1. An ACK that falls inside
//!   the window (the client saw a gap) therefore means "go back to n + 1".
//! - **Timeouts.** A retransmission timeout resends the OACK, or the whole window from the
//!   first unacknowledged block (go-back-N). Consecutive timeouts without progress are counted;
//!   past `max_retries` the transfer is abandoned.
//! - **Duplicate ACKs** (for a block already acknowledged) are ignored and never trigger a
//!   resend: resending on duplicates is the "Sorcerer's Apprentice" bug of RFC 1350, where every
//!   packet ends up sent twice for the rest of the transfer. Only the timer resends.
//! - **Block numbers past 65535 wrap to 0** (65535 is followed by 0, then 1). This is what
//!   tftp-hpa, curl, atftp and iPXE expect; wrapping to 1 would make them see block 0 as a gap.
//!   Blocks are tracked internally as 64-bit indexes and an ACK's 16-bit number is mapped back
//!   to the one index in the outstanding range that matches it, so stale ACKs from before a wrap
//!   are recognised and ignored.
//! - **End of file.** The last block is shorter than `blksize`; when the file size is a
//!   multiple of `blksize` (including an empty file) a zero-length block ends the transfer.
//!   The transfer is done when that block is acknowledged.

use std::time::Duration;

use super::packet::{DEFAULT_BLKSIZE, ErrorCode, MIN_BLKSIZE, Options};

/// Server-side bounds for what a client may negotiate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest block size granted; the caller sets it to the interface MTU minus 32 (IPv4 and
    /// UDP headers plus the 4-byte DATA header) so blocks are never IP-fragmented.
    pub(crate) max_blksize: u16,
    /// Largest window granted.
    pub(crate) max_windowsize: u16,
    /// Retransmission timeout when the client does not ask for one.
    pub(crate) default_timeout: Duration,
    /// Longest retransmission timeout a client may ask for (see [`negotiate`]).
    pub(crate) max_timeout: Duration,
}

/// The parameters one transfer runs with, after negotiation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Negotiated {
    /// Data bytes per block.
    pub blksize: u16,
    /// Blocks sent before waiting for an ACK (1 is RFC 1350 lockstep).
    pub windowsize: u16,
    /// Retransmission timeout.
    pub timeout: Duration,
    /// The options to acknowledge in an OACK, or `None` to start with DATA block 1 directly
    /// (RFC 2347: no OACK when no option was accepted).
    pub oack: Option<Options>,
}

/// Decide the transfer parameters from the client's options, the file size and our limits.
///
/// `blksize` and `windowsize` are lowered to our limits (RFC 2348 and 7440 let the server answer
/// with a smaller value); `tsize` is answered with the file size. A `timeout` up to
/// `max_timeout` is accepted as asked. A longer one is clamped to `max_timeout` for our own
/// retransmissions and left out of the OACK: RFC 2349 lets the server only echo the client's
/// value or not acknowledge the option, and EDK2 rejects an OACK whose timeout differs from
/// its request (`Mtftp4RrqOackValid()`, tianocore/edk2 NetworkPkg/Mtftp4Dxe/Mtftp4Rrq.c,
/// edk2-stable202211), so a lowered value would end the transfer.
pub(crate) fn negotiate(requested: &Options, file_size: u64, limits: &Limits) -> Negotiated {
    let max_blksize = limits.max_blksize.max(MIN_BLKSIZE);
    let max_windowsize = limits.max_windowsize.max(1);
    let asked_timeout = requested.timeout.map(|s| Duration::from_secs(u64::from(s)));
    let accepted = Options {
        blksize: requested.blksize.map(|b| b.min(max_blksize)),
        timeout: requested
            .timeout
            .filter(|&s| Duration::from_secs(u64::from(s)) <= limits.max_timeout),
        tsize: requested.tsize.map(|_| file_size),
        windowsize: requested.windowsize.map(|w| w.min(max_windowsize)),
    };
    Negotiated {
        blksize: accepted.blksize.unwrap_or(DEFAULT_BLKSIZE.min(max_blksize)),
        windowsize: accepted.windowsize.unwrap_or(1),
        timeout: asked_timeout
            .map(|t| t.min(limits.max_timeout))
            .unwrap_or(limits.default_timeout),
        oack: (!accepted.is_empty()).then_some(accepted),
    }
}

/// Something that happened to the transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The client acknowledged this 16-bit block number.
    Ack(u16),
    /// The client sent an ERROR packet.
    Error {
        /// The client's error code.
        code: ErrorCode,
        /// The client's message.
        message: String,
    },
    /// The retransmission timeout expired with no progress since the last send.
    Timeout,
}

/// One block of file data to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DataBlock {
    /// 1-based block index that never wraps (for logs and tests).
    pub index: u64,
    /// Block number on the wire (`index` modulo 65536).
    pub block: u16,
    /// Byte offset of the block in the file.
    pub(crate) offset: u64,
    /// Number of bytes; below `blksize` only for the last block, and 0 when the file size is a
    /// multiple of `blksize`.
    pub len: usize,
}

/// Why a transfer ended without completing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AbortReason {
    /// The client sent ERROR. Nothing is sent back.
    PeerError {
        /// The client's error code.
        code: ErrorCode,
        /// The client's message.
        message: String,
    },
    /// The client stopped answering.
    RetriesExhausted {
        /// Retransmissions made without any progress.
        retries: u32,
    },
}

/// What the caller must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Send an OACK with these options.
    SendOack(Options),
    /// Send this block of the file.
    SendData(DataBlock),
    /// The client acknowledged the last block: the transfer completed.
    Done,
    /// The transfer is over without completing.
    Abort(AbortReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// OACK sent, waiting for ACK 0.
    AwaitOackAck,
    /// Sending data windows.
    Sending,
    /// Completed or aborted; every further event is ignored.
    Finished,
}

/// The state of one read transfer (see the module documentation for the rules).
#[derive(Debug, Clone)]
pub(crate) struct Transfer {
    blksize: u64,
    windowsize: u64,
    timeout: Duration,
    max_retries: u32,
    file_size: u64,
    /// Index of the final (short or empty) block.
    last_block: u64,
    oack: Option<Options>,
    phase: Phase,
    /// Highest block index the client acknowledged (0: none yet, or the OACK).
    acked: u64,
    /// Next block index to send.
    next: u64,
    /// Timeouts since the last progress.
    retries: u32,
}

impl Transfer {
    /// A transfer of `file_size` bytes with the negotiated parameters, giving up after
    /// `max_retries` retransmissions in a row without progress.
    pub fn new(negotiated: &Negotiated, file_size: u64, max_retries: u32) -> Self {
        let blksize = u64::from(negotiated.blksize.max(MIN_BLKSIZE));
        Transfer {
            blksize,
            windowsize: u64::from(negotiated.windowsize.max(1)),
            timeout: negotiated.timeout,
            max_retries,
            file_size,
            last_block: file_size / blksize + 1,
            oack: negotiated.oack,
            phase: Phase::Sending,
            acked: 0,
            next: 1,
            retries: 0,
        }
    }

    /// The first packets: the OACK, or the first window of data.
    pub fn start(&mut self, out: &mut Vec<Action>) {
        match self.oack {
            Some(options) => {
                self.phase = Phase::AwaitOackAck;
                out.push(Action::SendOack(options));
            }
            None => {
                self.phase = Phase::Sending;
                self.send_window(out);
            }
        }
    }

    /// Feed one event; the resulting actions are appended to `out`.
    ///
    /// An event that changes nothing (a duplicate or stale ACK) appends nothing; the caller
    /// should then keep its retransmission timer running rather than restart it.
    pub fn handle(&mut self, event: Event, out: &mut Vec<Action>) {
        if self.phase == Phase::Finished {
            return;
        }
        match event {
            Event::Error { code, message } => {
                self.phase = Phase::Finished;
                out.push(Action::Abort(AbortReason::PeerError { code, message }));
            }
            Event::Timeout => {
                if self.retries >= self.max_retries {
                    self.phase = Phase::Finished;
                    out.push(Action::Abort(AbortReason::RetriesExhausted {
                        retries: self.retries,
                    }));
                    return;
                }
                self.retries += 1;
                match (self.phase, self.oack) {
                    (Phase::AwaitOackAck, Some(options)) => out.push(Action::SendOack(options)),
                    _ => {
                        // Go-back-N: everything after the last acknowledged block again.
                        self.next = self.acked + 1;
                        self.send_window(out);
                    }
                }
            }
            Event::Ack(block) => match self.phase {
                Phase::AwaitOackAck => {
                    if block == 0 {
                        self.phase = Phase::Sending;
                        self.retries = 0;
                        self.send_window(out);
                    }
                }
                Phase::Sending => self.on_data_ack(block, out),
                Phase::Finished => {}
            },
        }
    }

    fn on_data_ack(&mut self, block: u16, out: &mut Vec<Action>) {
        // The outstanding range is acked..next-1, at most 65536 indexes long (windowsize is a
        // u16), so exactly one index in it carries this 16-bit number, if any.
        let delta = u64::from(block.wrapping_sub(self.acked as u16));
        let index = self.acked + delta;
        if delta == 0 || index >= self.next {
            // Duplicate, stale (from before a wrap or an earlier window) or for a block never
            // sent: no progress, no resend.
            return;
        }
        self.acked = index;
        self.retries = 0;
        if index == self.last_block {
            self.phase = Phase::Finished;
            out.push(Action::Done);
            return;
        }
        // Whole window acknowledged: continue. Part of it: the client saw a gap, so resume
        // right after the last block it has.
        self.next = index + 1;
        self.send_window(out);
    }

    fn send_window(&mut self, out: &mut Vec<Action>) {
        let window_end = self
            .acked
            .saturating_add(self.windowsize)
            .min(self.last_block);
        while self.next <= window_end {
            out.push(Action::SendData(self.block(self.next)));
            self.next += 1;
        }
    }

    fn block(&self, index: u64) -> DataBlock {
        let offset = (index - 1) * self.blksize;
        DataBlock {
            index,
            block: index as u16,
            offset,
            len: self.file_size.saturating_sub(offset).min(self.blksize) as usize,
        }
    }

    /// How long to wait after a send before reporting [`Event::Timeout`].
    pub(crate) fn retransmit_timeout(&self) -> Duration {
        self.timeout
    }

    /// Bytes of the file the client has acknowledged.
    pub(crate) fn bytes_acknowledged(&self) -> u64 {
        (self.acked * self.blksize).min(self.file_size)
    }

    #[cfg(test)]
    /// Whether the transfer completed or was aborted.
    pub(crate) fn is_finished(&self) -> bool {
        self.phase == Phase::Finished
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_blksize: 1468,
            max_windowsize: 64,
            default_timeout: Duration::from_secs(2),
            max_timeout: Duration::from_secs(10),
        }
    }

    fn plain(blksize: u16, windowsize: u16) -> Negotiated {
        Negotiated {
            blksize,
            windowsize,
            timeout: Duration::from_secs(1),
            oack: None,
        }
    }

    fn data(actions: &[Action]) -> Vec<(u64, u16, u64, usize)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::SendData(d) => Some((d.index, d.block, d.offset, d.len)),
                _ => None,
            })
            .collect()
    }

    fn step(t: &mut Transfer, event: Event) -> Vec<Action> {
        let mut out = Vec::new();
        t.handle(event, &mut out);
        out
    }

    fn started(t: &mut Transfer) -> Vec<Action> {
        let mut out = Vec::new();
        t.start(&mut out);
        out
    }

    #[test]
    fn negotiation_caps_to_limits_and_answers_tsize() {
        let requested = Options {
            blksize: Some(65464),
            timeout: Some(6),
            tsize: Some(0),
            windowsize: Some(1000),
        };
        let n = negotiate(&requested, 1_048_576, &limits());
        assert_eq!(n.blksize, 1468);
        assert_eq!(n.windowsize, 64);
        assert_eq!(n.timeout, Duration::from_secs(6));
        assert_eq!(
            n.oack,
            Some(Options {
                blksize: Some(1468),
                timeout: Some(6),
                tsize: Some(1_048_576),
                windowsize: Some(64),
            })
        );

        let small = Options {
            blksize: Some(512),
            windowsize: Some(4),
            ..Options::default()
        };
        let n = negotiate(&small, 10, &limits());
        assert_eq!((n.blksize, n.windowsize), (512, 4));
        assert_eq!(n.timeout, Duration::from_secs(2));
        assert_eq!(n.oack.unwrap().tsize, None);
    }

    #[test]
    fn no_options_means_no_oack_and_rfc1350_defaults() {
        let n = negotiate(&Options::default(), 5000, &limits());
        assert_eq!(n, plain_with_default_timeout());
        // A tiny configured cap also bounds the default block size.
        let tiny = Limits {
            max_blksize: 100,
            ..limits()
        };
        assert_eq!(negotiate(&Options::default(), 5000, &tiny).blksize, 100);
    }

    #[test]
    fn a_long_timeout_is_clamped_and_not_acknowledged() {
        // What the hostile host of issue 12 asks: timeout=255, never acknowledging.
        let hostile = Options {
            timeout: Some(255),
            tsize: Some(0),
            ..Options::default()
        };
        let n = negotiate(&hostile, 1000, &limits());
        assert_eq!(n.timeout, Duration::from_secs(10));
        assert_eq!(
            n.oack,
            Some(Options {
                tsize: Some(1000),
                ..Options::default()
            }),
            "the OACK must not carry a timeout other than the one asked (RFC 2349, EDK2)"
        );
        // Only timeout asked, and too long: nothing accepted, so no OACK at all.
        let only = Options {
            timeout: Some(11),
            ..Options::default()
        };
        let n = negotiate(&only, 1000, &limits());
        assert_eq!((n.timeout, n.oack), (Duration::from_secs(10), None));
        // At the limit it is echoed as asked.
        let edge = Options {
            timeout: Some(10),
            ..Options::default()
        };
        let n = negotiate(&edge, 1000, &limits());
        assert_eq!(n.timeout, Duration::from_secs(10));
        assert_eq!(n.oack.unwrap().timeout, Some(10));
    }

    proptest::proptest! {
        /// Whatever timeout is asked, ours never exceeds the limit, and the OACK either echoes
        /// the client's exact value or leaves it out.
        #[test]
        fn negotiated_timeout_is_bounded_and_echoed_exactly(
            asked in proptest::option::of(1u8..=255),
            max in 1u64..=255,
        ) {
            let limits = Limits { max_timeout: Duration::from_secs(max), ..limits() };
            let requested = Options { timeout: asked, ..Options::default() };
            let n = negotiate(&requested, 10, &limits);
            proptest::prop_assert!(n.timeout <= limits.max_timeout.max(limits.default_timeout));
            if let Some(t) = n.oack.and_then(|o| o.timeout) {
                proptest::prop_assert_eq!(Some(t), asked);
                proptest::prop_assert_eq!(n.timeout, Duration::from_secs(u64::from(t)));
            }
        }
    }

    fn plain_with_default_timeout() -> Negotiated {
        Negotiated {
            timeout: Duration::from_secs(2),
            ..plain(512, 1)
        }
    }

    #[test]
    fn lockstep_transfer_of_a_short_file() {
        let mut t = Transfer::new(&plain(512, 1), 1000, 3);
        assert_eq!(data(&started(&mut t)), vec![(1, 1, 0, 512)]);
        assert_eq!(
            data(&step(&mut t, Event::Ack(1))),
            vec![(2, 2, 512, 1000 - 512)]
        );
        assert_eq!(t.bytes_acknowledged(), 512);
        assert_eq!(step(&mut t, Event::Ack(2)), vec![Action::Done]);
        assert!(t.is_finished());
        assert_eq!(t.bytes_acknowledged(), 1000);
        // Late packets after the end change nothing.
        assert!(step(&mut t, Event::Ack(2)).is_empty());
        assert!(step(&mut t, Event::Timeout).is_empty());
    }

    #[test]
    fn size_multiple_of_blksize_ends_with_an_empty_block() {
        let mut t = Transfer::new(&plain(512, 1), 1024, 3);
        started(&mut t);
        step(&mut t, Event::Ack(1));
        assert_eq!(data(&step(&mut t, Event::Ack(2))), vec![(3, 3, 1024, 0)]);
        assert_eq!(step(&mut t, Event::Ack(3)), vec![Action::Done]);
    }

    #[test]
    fn empty_file_is_one_empty_block() {
        let mut t = Transfer::new(&plain(512, 8), 0, 3);
        assert_eq!(data(&started(&mut t)), vec![(1, 1, 0, 0)]);
        assert_eq!(step(&mut t, Event::Ack(1)), vec![Action::Done]);
        assert_eq!(t.bytes_acknowledged(), 0);
    }

    #[test]
    fn oack_is_confirmed_by_ack_zero() {
        let requested = Options {
            blksize: Some(1468),
            tsize: Some(0),
            ..Options::default()
        };
        let n = negotiate(&requested, 3000, &limits());
        let mut t = Transfer::new(&n, 3000, 3);
        assert_eq!(started(&mut t), vec![Action::SendOack(n.oack.unwrap())]);
        // ACKs for other blocks are not a confirmation.
        assert!(step(&mut t, Event::Ack(1)).is_empty());
        assert_eq!(data(&step(&mut t, Event::Ack(0))), vec![(1, 1, 0, 1468)]);
    }

    #[test]
    fn client_error_after_oack_aborts_quietly() {
        // UEFI's tsize probe: RRQ with tsize, OACK, then ERROR 8.
        let requested = Options {
            tsize: Some(0),
            blksize: Some(1468),
            windowsize: Some(4),
            ..Options::default()
        };
        let n = negotiate(&requested, 1_000_000, &limits());
        let mut t = Transfer::new(&n, 1_000_000, 100);
        started(&mut t);
        let out = step(
            &mut t,
            Event::Error {
                code: ErrorCode::OptionNegotiation,
                message: "User aborted the transfer".into(),
            },
        );
        assert_eq!(
            out,
            vec![Action::Abort(AbortReason::PeerError {
                code: ErrorCode::OptionNegotiation,
                message: "User aborted the transfer".into(),
            })]
        );
        assert!(t.is_finished());
        // No OACK retransmission afterwards, however long the caller waits.
        for _ in 0..5 {
            assert!(step(&mut t, Event::Timeout).is_empty());
        }
    }

    #[test]
    fn client_error_mid_transfer_aborts() {
        let mut t = Transfer::new(&plain(512, 4), 100_000, 3);
        started(&mut t);
        step(&mut t, Event::Ack(4));
        let out = step(
            &mut t,
            Event::Error {
                code: ErrorCode::NotDefined,
                message: "disk full".into(),
            },
        );
        assert!(matches!(
            out.as_slice(),
            [Action::Abort(AbortReason::PeerError { .. })]
        ));
        assert_eq!(t.bytes_acknowledged(), 4 * 512);
    }

    #[test]
    fn oack_is_resent_on_timeout_until_the_retry_limit() {
        let requested = Options {
            tsize: Some(0),
            ..Options::default()
        };
        let n = negotiate(&requested, 10, &limits());
        let mut t = Transfer::new(&n, 10, 2);
        started(&mut t);
        let oack = Action::SendOack(n.oack.unwrap());
        assert_eq!(step(&mut t, Event::Timeout), vec![oack.clone()]);
        assert_eq!(step(&mut t, Event::Timeout), vec![oack]);
        assert_eq!(
            step(&mut t, Event::Timeout),
            vec![Action::Abort(AbortReason::RetriesExhausted { retries: 2 })]
        );
    }

    #[test]
    fn progress_resets_the_retry_count() {
        let mut t = Transfer::new(&plain(512, 1), 10_000, 1);
        started(&mut t);
        assert_eq!(data(&step(&mut t, Event::Timeout)), vec![(1, 1, 0, 512)]);
        step(&mut t, Event::Ack(1));
        assert_eq!(data(&step(&mut t, Event::Timeout)), vec![(2, 2, 512, 512)]);
        assert!(matches!(
            step(&mut t, Event::Timeout).as_slice(),
            [Action::Abort(AbortReason::RetriesExhausted { retries: 1 })]
        ));
    }

    #[test]
    fn duplicate_ack_never_triggers_a_resend() {
        // Sorcerer's Apprentice: a delayed duplicate ACK must not cause a second copy of the
        // next block.
        let mut t = Transfer::new(&plain(512, 1), 10_000, 3);
        started(&mut t);
        assert_eq!(data(&step(&mut t, Event::Ack(1))), vec![(2, 2, 512, 512)]);
        assert!(step(&mut t, Event::Ack(1)).is_empty());
        assert!(step(&mut t, Event::Ack(1)).is_empty());
        assert_eq!(data(&step(&mut t, Event::Ack(2))), vec![(3, 3, 1024, 512)]);
    }

    #[test]
    fn acks_for_unsent_or_stale_blocks_are_ignored() {
        let mut t = Transfer::new(&plain(512, 4), 100_000, 3);
        started(&mut t);
        assert!(step(&mut t, Event::Ack(5)).is_empty(), "block 5 not sent");
        assert!(step(&mut t, Event::Ack(60000)).is_empty());
        assert_eq!(data(&step(&mut t, Event::Ack(4))).len(), 4);
        assert!(step(&mut t, Event::Ack(2)).is_empty(), "stale partial ACK");
        assert!(step(&mut t, Event::Ack(0)).is_empty(), "stale OACK ACK");
    }

    #[test]
    fn window_go_back_n() {
        let mut t = Transfer::new(&plain(512, 4), 100_000, 5);
        let first = data(&started(&mut t));
        assert_eq!(
            first.iter().map(|d| d.0).collect::<Vec<_>>(),
            vec![1, 2, 3, 4]
        );
        // Nothing came back: the whole window again.
        assert_eq!(
            data(&step(&mut t, Event::Timeout))
                .iter()
                .map(|d| d.0)
                .collect::<Vec<_>>(),
            vec![1, 2, 3, 4]
        );
        // Client has 1 and 2 but lost 3: resume from 3 with a full window.
        assert_eq!(
            data(&step(&mut t, Event::Ack(2)))
                .iter()
                .map(|d| d.0)
                .collect::<Vec<_>>(),
            vec![3, 4, 5, 6]
        );
        // Whole window acknowledged: the next one.
        assert_eq!(
            data(&step(&mut t, Event::Ack(6)))
                .iter()
                .map(|d| (d.0, d.2))
                .collect::<Vec<_>>(),
            vec![(7, 3072), (8, 3584), (9, 4096), (10, 4608)]
        );
    }

    #[test]
    fn window_is_cut_at_the_last_block() {
        let mut t = Transfer::new(&plain(512, 8), 1500, 5);
        assert_eq!(
            data(&started(&mut t)),
            vec![(1, 1, 0, 512), (2, 2, 512, 512), (3, 3, 1024, 476)]
        );
        assert_eq!(step(&mut t, Event::Ack(3)), vec![Action::Done]);
    }

    #[test]
    fn block_numbers_wrap_from_65535_to_0() {
        // 8-byte blocks keep a >65535-block file small (about 512 KiB).
        let size = 65_540u64 * 8 + 3;
        let mut t = Transfer::new(&plain(8, 1), size, 3);
        started(&mut t);
        for b in 1..=65534u16 {
            step(&mut t, Event::Ack(b));
        }
        assert_eq!(
            data(&step(&mut t, Event::Ack(65534))),
            vec![],
            "duplicate ignored"
        );
        assert_eq!(
            data(&step(&mut t, Event::Ack(65535))),
            vec![(65536, 0, 65535 * 8, 8)]
        );
        // A stale ACK 65535 after the wrap is a duplicate, not a jump forward.
        assert!(step(&mut t, Event::Ack(65535)).is_empty());
        assert_eq!(
            data(&step(&mut t, Event::Ack(0))),
            vec![(65537, 1, 65536 * 8, 8)]
        );
        for b in 1..=4u16 {
            step(&mut t, Event::Ack(b));
        }
        assert_eq!(t.bytes_acknowledged(), 65540 * 8);
        assert_eq!(step(&mut t, Event::Ack(5)), vec![Action::Done]);
        assert_eq!(t.bytes_acknowledged(), size);
    }

    /// Deterministic xorshift so loss patterns are reproducible without a dependency.
    struct Rng(u64);
    impl Rng {
        fn chance(&mut self, percent: u64) -> bool {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % 100 < percent
        }
    }

    /// A receiver behaving like RFC 7440 clients: ACK at the end of each window, at the short
    /// final block, on any out-of-order block (ACKing the last in-order one), and on its own
    /// timeout. It re-ACKs duplicates too, which is what provokes a naive sender into the
    /// Sorcerer's Apprentice.
    struct Client {
        blksize: usize,
        windowsize: u16,
        expected: u16,
        in_window: u16,
        received: Vec<u8>,
        done: bool,
    }

    impl Client {
        fn on_data(&mut self, block: u16, bytes: &[u8], acks: &mut Vec<u16>) {
            if block == self.expected && !self.done {
                self.received.extend_from_slice(bytes);
                self.expected = self.expected.wrapping_add(1);
                self.in_window += 1;
                if bytes.len() < self.blksize {
                    self.done = true;
                    acks.push(block);
                } else if self.in_window == self.windowsize {
                    self.in_window = 0;
                    acks.push(block);
                }
            } else {
                self.in_window = 0;
                acks.push(self.expected.wrapping_sub(1));
            }
        }
    }

    /// Run a whole transfer over a lossy in-memory network; returns what the client received.
    fn simulate(
        file: &[u8],
        requested: Options,
        loss_percent: u64,
        seed: u64,
    ) -> (Vec<u8>, Transfer) {
        let n = negotiate(&requested, file.len() as u64, &limits());
        let mut t = Transfer::new(&n, file.len() as u64, 1000);
        let mut client = Client {
            blksize: usize::from(n.blksize),
            windowsize: n.windowsize,
            expected: 1,
            in_window: 0,
            received: Vec::new(),
            done: false,
        };
        let mut rng = Rng(seed);
        let mut actions = Vec::new();
        t.start(&mut actions);
        for _round in 0..1_000_000 {
            let mut acks = Vec::new();
            let mut delivered = 0;
            for action in actions.drain(..) {
                match action {
                    Action::Done => {
                        assert!(client.done);
                        return (client.received, t);
                    }
                    Action::Abort(reason) => panic!("aborted: {reason:?}"),
                    _ if rng.chance(loss_percent) => {}
                    Action::SendOack(_) => {
                        delivered += 1;
                        acks.push(0);
                    }
                    Action::SendData(d) => {
                        delivered += 1;
                        let start = d.offset as usize;
                        client.on_data(d.block, &file[start..start + d.len], &mut acks);
                    }
                }
            }
            if delivered == 0 {
                // Client timeout: re-ACK the last in-order block.
                acks.push(client.expected.wrapping_sub(1));
            }
            let mut progressed = false;
            for ack in acks {
                if rng.chance(loss_percent) {
                    continue;
                }
                let before = actions.len();
                t.handle(Event::Ack(ack), &mut actions);
                progressed |= actions.len() > before;
            }
            if !progressed && actions.is_empty() {
                t.handle(Event::Timeout, &mut actions);
            }
        }
        panic!("transfer did not finish");
    }

    fn pseudo_random_file(len: usize, seed: u64) -> Vec<u8> {
        let mut rng = Rng(seed);
        (0..len)
            .map(|_| {
                rng.chance(0);
                rng.0 as u8
            })
            .collect()
    }

    #[test]
    fn lossless_windowed_transfer_delivers_the_file() {
        let file = pseudo_random_file(100_000, 7);
        for windowsize in [1, 2, 8, 64] {
            let requested = Options {
                blksize: Some(1024),
                windowsize: Some(windowsize),
                ..Options::default()
            };
            let (got, t) = simulate(&file, requested, 0, 1);
            assert_eq!(got, file, "windowsize {windowsize}");
            assert_eq!(t.bytes_acknowledged(), file.len() as u64);
        }
    }

    #[test]
    fn lossy_transfers_deliver_the_file_exactly() {
        let file = pseudo_random_file(50_000, 11);
        for (windowsize, loss) in [(1, 10), (4, 20), (16, 30), (64, 5)] {
            for seed in 1..=5u64 {
                let requested = Options {
                    blksize: Some(512),
                    windowsize: Some(windowsize),
                    tsize: Some(0),
                    ..Options::default()
                };
                let (got, _) = simulate(&file, requested, loss, seed * 7919);
                assert_eq!(
                    got, file,
                    "windowsize {windowsize}, loss {loss}%, seed {seed}"
                );
            }
        }
    }

    #[test]
    fn lossy_transfer_across_the_block_number_wrap() {
        // 70,000 blocks of 8 bytes, windows of 16, with loss around the wrap.
        let file = pseudo_random_file(70_000 * 8 + 5, 3);
        let requested = Options {
            blksize: Some(8),
            windowsize: Some(16),
            ..Options::default()
        };
        let (got, _) = simulate(&file, requested, 3, 42);
        assert_eq!(got, file);
    }

    #[test]
    fn multiple_of_blksize_over_lossy_network() {
        let file = pseudo_random_file(64 * 512, 5);
        let requested = Options {
            blksize: Some(512),
            windowsize: Some(8),
            ..Options::default()
        };
        let (got, _) = simulate(&file, requested, 15, 99);
        assert_eq!(got, file);
    }
}
