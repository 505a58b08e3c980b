//! The cluster token checked at a connection's handshake. The learner's
//! socket is a ZeroMQ PLAIN server whose ZAP handler (RFC 27) admits only
//! connections that give the cluster token as their password: a peer
//! without it gets no message through, not even one that libzmq would
//! buffer whole before the protocol's hello could be read. Peers give the
//! token as their PLAIN password and watch their socket's handshakes, so
//! that a refused one stops with the reason instead of waiting.
//!
//! `inproc://` connections use no security mechanism in libzmq: between
//! threads of one process the hello's token is the only check. PLAIN
//! sends the token in clear; CURVE would not, but the libzmq the `zmq`
//! crate builds has no libsodium.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::Context as _;

use super::tokens_match;

/// Where libzmq sends the ZAP requests of the sockets of a context.
const ZAP_ENDPOINT: &str = "inproc://zeromq.zap.01";

/// The ZAP domain of the learner's socket.
pub(super) const ZAP_DOMAIN: &str = "embshard";

/// The PLAIN user name peers give (the learner checks only the password).
pub(super) const PLAIN_USER: &str = "embshard";

/// The longest cluster token, in bytes: PLAIN carries a password of at
/// most 255.
pub const MAX_TOKEN_BYTES: usize = 255;

/// How many distinct addresses get a warning when refused; refusals from
/// further ones are counted, not logged.
const WARNED_ADDRESSES: usize = 1024;

/// How long the handler waits for a request before it looks at its stop
/// flag again, in milliseconds.
const POLL_MS: i64 = 100;

/// An error unless `token` can be a PLAIN password (1 to 255 bytes) and
/// is one line without control characters (a file of two tokens, or a
/// binary file, is a mistake to name, not a token).
pub(super) fn check_token(token: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !token.is_empty() && token.len() <= MAX_TOKEN_BYTES,
        "the cluster token has {} bytes: ZeroMQ's PLAIN handshake carries 1 to {MAX_TOKEN_BYTES}",
        token.len()
    );
    if let Some(c) = token.chars().find(|c| c.is_control()) {
        anyhow::bail!(
            "the cluster token holds the control character {c:?}: a token is one line of \
             printable text"
        );
    }
    Ok(())
}

/// The handler's answer to one ZAP request.
#[derive(Debug, PartialEq, Eq)]
struct Verdict {
    /// The request's id, echoed.
    request_id: Vec<u8>,
    /// "200" (admitted), "400" (refused) or "500" (a request not understood).
    status: &'static str,
    /// Why, in words.
    text: &'static str,
    /// The user name admitted ("" when refused).
    user: Vec<u8>,
    /// The connecting peer's address as libzmq gives it (an IP address for
    /// tcp, possibly empty for ipc).
    address: String,
}

impl Verdict {
    /// The reply's frames: version, request id, status code, status text,
    /// user id and (empty) metadata.
    fn reply(&self) -> [&[u8]; 6] {
        [
            b"1.0",
            &self.request_id,
            self.status.as_bytes(),
            self.text.as_bytes(),
            &self.user,
            b"",
        ]
    }
}

/// Judges a ZAP request: version "1.0", request id, domain, address,
/// routing id, mechanism, then the mechanism's credentials (for PLAIN a
/// user name and a password). Only PLAIN with `token` as its password is
/// admitted.
fn judge(request: &[Vec<u8>], token: &str) -> Verdict {
    let frame = |i: usize| request.get(i).map(Vec::as_slice).unwrap_or_default();
    let mut verdict = Verdict {
        request_id: frame(1).to_vec(),
        status: "400",
        text: "wrong cluster token",
        user: Vec::new(),
        address: String::from_utf8_lossy(frame(3)).into_owned(),
    };
    if request.len() < 6 || frame(0) != b"1.0" {
        verdict.status = "500";
        verdict.text = "malformed ZAP request";
    } else if frame(5) != b"PLAIN" {
        verdict.text = "no cluster token (PLAIN credentials required)";
    } else if request.len() != 8 {
        verdict.text = "malformed PLAIN credentials";
    } else if std::str::from_utf8(frame(7)).is_ok_and(|p| tokens_match(p, token)) {
        verdict.status = "200";
        verdict.text = "OK";
        verdict.user = frame(6).to_vec();
    }
    verdict
}

/// The learner's ZAP handler: a thread that answers libzmq's requests on
/// `inproc://zeromq.zap.01` of one context, and counts the connections
/// that fail the handshake before any request (a peer that offers no PLAIN
/// credentials, or speaks no ZeroMQ), which it learns from a monitor of
/// the learner's socket. Dropping it stops the thread and waits for it.
pub(super) struct ZapHandler {
    /// Set when dropped: the thread stops within [`POLL_MS`].
    stop: Arc<AtomicBool>,
    /// What the thread counts, read here.
    counts: Arc<Counts>,
    /// The thread, joined when dropped.
    thread: Option<JoinHandle<()>>,
}

impl ZapHandler {
    /// Binds the ZAP endpoint of `ctx` and starts answering: connections
    /// are admitted when their PLAIN password is `token`. One per context.
    /// `router` is the learner's socket, not bound yet (its handshakes
    /// are watched from its first connection on).
    pub(super) fn start(
        ctx: &zmq::Context,
        token: &str,
        router: &zmq::Socket,
    ) -> anyhow::Result<ZapHandler> {
        check_token(token)?;
        let socket = ctx.socket(zmq::REP)?;
        socket.set_linger(0)?;
        socket.bind(ZAP_ENDPOINT).with_context(|| {
            format!(
                "binding the ZAP handler at {ZAP_ENDPOINT} (one learner socket with a cluster \
                 token per ZeroMQ context)"
            )
        })?;
        let events = monitor(
            ctx,
            router,
            &[
                zmq::SocketEvent::HANDSHAKE_FAILED_PROTOCOL,
                zmq::SocketEvent::ACCEPTED,
                zmq::SocketEvent::DISCONNECTED,
            ],
            "the learner's handshakes",
        )?;
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Counts::default());
        let (s, t, c) = (stop.clone(), token.to_string(), counts.clone());
        let thread = std::thread::Builder::new()
            .name("zap".into())
            .spawn(move || {
                serve(&socket, &events, &t, &s, &c);
                // Free at once for another handler on this context (closing
                // the socket frees it later, in libzmq's own time).
                let _ = socket.unbind(ZAP_ENDPOINT);
            })
            .context("starting the ZAP handler's thread")?;
        Ok(ZapHandler {
            stop,
            counts,
            thread: Some(thread),
        })
    }

    /// Connections refused at their handshake so far: by the ZAP handler
    /// (another token), or reported failed by libzmq (no PLAIN credentials,
    /// a malformed handshake).
    pub(super) fn refused(&self) -> u64 {
        self.counts.refused.load(Ordering::Relaxed)
    }

    /// Connections open now over `tcp://` and `ipc://`, said hello or not.
    pub(super) fn open(&self) -> u64 {
        self.counts.open.load(Ordering::Relaxed)
    }

    /// Connections closed at once because [`ZapHandler::cap`] were open.
    pub(super) fn shed(&self) -> u64 {
        self.counts.shed.load(Ordering::Relaxed)
    }

    /// The most connections kept open now.
    pub(super) fn cap(&self) -> u64 {
        connection_cap(&self.counts.cap)
    }

    /// Keeps at most `cap` connections open from now on (0: the open-files
    /// limit less [`RESERVED_FILES`], the default).
    pub(super) fn set_cap(&self, cap: u64) {
        self.counts.cap.store(cap, Ordering::Relaxed);
    }
}

/// File descriptors kept for the learner's own files and ZeroMQ's own
/// sockets: connections beyond the open-files limit less these are closed
/// as they come.
pub const RESERVED_FILES: u64 = 256;

/// The fewest connections the cap from the open-files limit allows.
const MIN_CAP: u64 = 64;

/// The most connections kept open: `set` where not 0, else the open-files
/// limit in force now less [`RESERVED_FILES`] (at least [`MIN_CAP`]: under
/// a limit of 320 fewer are kept for the learner); no cap where the limit
/// is unlimited or unknown.
fn connection_cap(set: &AtomicU64) -> u64 {
    match set.load(Ordering::Relaxed) {
        0 => rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .map_or(u64::MAX, |n| n.saturating_sub(RESERVED_FILES).max(MIN_CAP)),
        n => n,
    }
}

/// The handler's counters, shared by its thread and the [`ZapHandler`].
#[derive(Debug, Default)]
struct Counts {
    /// Connections refused so far.
    refused: AtomicU64,
    /// Connections open now (over `tcp://` and `ipc://`).
    open: AtomicU64,
    /// The most connections kept open; 0: the open-files limit less
    /// [`RESERVED_FILES`].
    cap: AtomicU64,
    /// Connections closed at once because the cap was reached.
    shed: AtomicU64,
}

/// Open connections from which a warning says how many there are, then
/// at each doubling (each holds a file descriptor of the learner's).
const MANY_CONNECTIONS: u64 = 256;

/// Counts the connections open and says so when they grow past
/// [`MANY_CONNECTIONS`] and at each doubling beyond; closes those beyond
/// the cap.
#[derive(Debug)]
struct Connections {
    next_warning: u64,
    warner: crate::warn::Warner,
}

impl Connections {
    /// A connection accepted on `endpoint` as file descriptor `fd`
    /// (`None`: one that has ended already).
    fn accepted(&mut self, counts: &Counts, fd: Option<u32>, endpoint: &str) {
        let n = counts.open.fetch_add(1, Ordering::Relaxed) + 1;
        let cap = connection_cap(&counts.cap);
        if n > cap && fd.is_some_and(|fd| shut(fd, endpoint)) {
            let shed = counts.shed.fetch_add(1, Ordering::Relaxed) + 1;
            self.warner
                .warn("over the cap", std::time::Instant::now(), || {
                    format!(
                    "{n} connections open to the learner, over its cap of {cap} (by default the \
                     open-files limit less {RESERVED_FILES} for its own files): the newest is \
                     closed ({shed} so far; an embshard peer connects again by itself; raise \
                     `ulimit -n` for more)"
                )
                });
            return;
        }
        if n >= self.next_warning {
            tracing::warn!(
                "{n} connections open to the learner, each a file descriptor (one that has not \
                 finished its handshake after {} s is closed)",
                super::HANDSHAKE_MS / 1000
            );
            self.next_warning = n.saturating_mul(2);
        }
    }

    fn closed(&mut self, open: &AtomicU64) {
        let n = open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            })
            .map_or(0, |n| n.saturating_sub(1));
        // Fewer again: the next growth is said from a lower mark.
        while self.next_warning > MANY_CONNECTIONS && n < self.next_warning / 4 {
            self.next_warning /= 2;
        }
    }
}

impl Drop for ZapHandler {
    fn drop(&mut self) {
        // The thread's sockets hold clones of the context, so the context
        // is never terminated under them: the flag is what stops it.
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the ZAP handler panicked");
            }
        }
    }
}

/// Shuts down the connection of file descriptor `fd`, accepted on
/// `endpoint`, so that libzmq reads its end and closes it (the descriptor
/// is libzmq's to close). Returns false, touching nothing, unless `fd` is
/// a connected socket whose local address is `endpoint`'s (its port, where
/// the endpoint is a wildcard address): libzmq may have closed it since,
/// and the number may be another file's now.
///
/// What is left of that race: the number may by now be another connection
/// to the same endpoint, accepted since (the events come in order, and an
/// end among those already read spares it). That one is then shut down in
/// its place; a peer of the cluster connects again by itself.
fn shut(fd: u32, endpoint: &str) -> bool {
    use rustix::net::{getpeername, getsockname, shutdown, Shutdown, SocketAddrUnix};
    let Ok(raw) = std::os::fd::RawFd::try_from(fd) else {
        return false;
    };
    // SAFETY: `borrow_raw` asks that the number stay open while borrowed,
    // which cannot be promised: libzmq's thread may close it meanwhile.
    // Only socket system calls are made through it (no memory is read
    // through it, nothing is closed), so a closed or reused number makes
    // them fail or act on that socket; it cannot corrupt memory.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(raw) };
    let (Ok(local), Ok(_)) = (getsockname(fd), getpeername(fd)) else {
        return false;
    };
    let ours = if let Some(addr) = endpoint.strip_prefix("tcp://") {
        let local = std::net::SocketAddr::try_from(local);
        match addr.parse::<std::net::SocketAddr>() {
            Ok(bound) if !bound.ip().is_unspecified() => local.is_ok_and(|a| a == bound),
            _ => {
                let port = addr.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
                local.is_ok_and(|a| Some(a.port()) == port)
            }
        }
    } else if let Some(path) = endpoint.strip_prefix("ipc://") {
        SocketAddrUnix::try_from(local)
            .is_ok_and(|a| a.path().is_some_and(|p| p.to_bytes() == path.as_bytes()))
    } else {
        false
    };
    ours && shutdown(fd, Shutdown::Both).is_ok()
}

/// A PAIR socket on which `socket`'s `events` arrive (a socket monitor);
/// set up before `socket` binds or connects, so that none is missed.
fn monitor(
    ctx: &zmq::Context,
    socket: &zmq::Socket,
    events: &[zmq::SocketEvent],
    what: &str,
) -> anyhow::Result<zmq::Socket> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let endpoint = format!(
        "inproc://embshard-monitor-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let mask = events.iter().fold(0, |m, e| m | i32::from(e.to_raw()));
    socket
        .monitor(&endpoint, mask)
        .with_context(|| format!("watching {what}"))?;
    let pair = ctx.socket(zmq::PAIR)?;
    pair.set_linger(0)?;
    pair.connect(&endpoint)?;
    Ok(pair)
}

/// The next event waiting on a monitor's `pair` socket, without waiting:
/// its number, its value and the endpoint it concerns.
fn next_event(pair: &zmq::Socket) -> anyhow::Result<Option<(u16, u32, String)>> {
    loop {
        let parts = match pair.recv_multipart(zmq::DONTWAIT) {
            Ok(p) => p,
            Err(zmq::Error::EAGAIN | zmq::Error::EINTR) => return Ok(None),
            Err(e) => return Err(e).context("reading socket events"),
        };
        // The first frame: the event's number (u16) and value (u32), in the
        // host's byte order; the second: the endpoint.
        let Some(head) = parts.first().filter(|h| h.len() >= 6) else {
            continue;
        };
        let event = u16::from_ne_bytes([head[0], head[1]]);
        let value = u32::from_ne_bytes([head[2], head[3], head[4], head[5]]);
        let endpoint = parts
            .get(1)
            .map(|e| String::from_utf8_lossy(e).into_owned())
            .unwrap_or_default();
        return Ok(Some((event, value, endpoint)));
    }
}

/// libzmq's code for a peer whose security mechanism is not this one's.
const MECHANISM_MISMATCH: u32 = 0x1100_0002;

/// Refusals to log: the first of each address (or kind), up to
/// [`WARNED_ADDRESSES`]; the others are counted only.
#[derive(Default)]
struct RefusalLog {
    /// Where refusals were warned about.
    warned: HashSet<String>,
}

impl RefusalLog {
    /// Logs a refusal of a connection from `from` (an address, or a kind
    /// of failure), the `n`th so far, for `why`: a warning the first time
    /// for `from`, after that at debug level.
    fn refused(&mut self, from: &str, why: &str, n: u64) {
        if self.warned.len() < WARNED_ADDRESSES && self.warned.insert(from.to_string()) {
            tracing::warn!(
                "refused a connection from {from} at its handshake: {why} ({n} refused so far; \
                 more from there are counted, not logged)"
            );
            if self.warned.len() == WARNED_ADDRESSES {
                tracing::warn!(
                    "connections from {WARNED_ADDRESSES} addresses refused: refusals from \
                     further ones are counted, not logged"
                );
            }
        } else {
            tracing::debug!("refused a connection from {from} at its handshake: {why}");
        }
    }
}

/// The handler's loop until `stop` is set: answers every ZAP request on
/// `zap`, reads the learner's failed handshakes on `events`, counts both
/// kinds of refusal in `refused`.
fn serve(zap: &zmq::Socket, events: &zmq::Socket, token: &str, stop: &AtomicBool, counts: &Counts) {
    let (refused, open) = (&counts.refused, &counts.open);
    let mut log = RefusalLog::default();
    let mut connections = Connections {
        next_warning: MANY_CONNECTIONS,
        warner: crate::warn::Warner::default(),
    };
    let accepted = zmq::SocketEvent::ACCEPTED.to_raw();
    let disconnected = zmq::SocketEvent::DISCONNECTED.to_raw();
    while !stop.load(Ordering::Relaxed) {
        let mut items = [
            zap.as_poll_item(zmq::POLLIN),
            events.as_poll_item(zmq::POLLIN),
        ];
        match zmq::poll(&mut items, POLL_MS) {
            Ok(0) | Err(zmq::Error::EINTR) => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::error!("the ZAP handler stopped: {e}");
                return;
            }
        }
        let (requests, failures) = (items[0].is_readable(), items[1].is_readable());
        if requests {
            if let Err(e) = answer(zap, token, refused, &mut log) {
                tracing::error!("the ZAP handler stopped: {e:#}");
                return;
            }
        }
        if failures {
            // All the events waiting, at once: an accepted connection whose
            // end is among them is not shut down (its number may be taken
            // by another connection by now).
            let mut batch = Vec::new();
            loop {
                match next_event(events) {
                    Ok(Some(e)) => batch.push(e),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::error!("the ZAP handler stopped: {e:#}");
                        return;
                    }
                }
            }
            for (i, (event, value, endpoint)) in batch.iter().enumerate() {
                if *event == accepted {
                    let ended = batch[i + 1..]
                        .iter()
                        .any(|(e, v, _)| *e == disconnected && v == value);
                    connections.accepted(counts, (!ended).then_some(*value), endpoint);
                } else if *event == disconnected {
                    connections.closed(open);
                } else {
                    let n = refused.fetch_add(1, Ordering::Relaxed) + 1;
                    let (from, why) = if *value == MECHANISM_MISMATCH {
                        (
                            format!("a peer without PLAIN credentials on {endpoint}"),
                            "no cluster token (an embshard peer of an older version, or not an \
                             embshard peer)"
                                .to_string(),
                        )
                    } else {
                        (
                            format!("a peer on {endpoint} (ZeroMQ error {value:#x})"),
                            format!("ZeroMQ protocol error {value:#x}"),
                        )
                    };
                    log.refused(&from, &why, n);
                }
            }
        }
    }
}

/// Answers the ZAP request waiting on `zap`, if any.
fn answer(
    zap: &zmq::Socket,
    token: &str,
    refused: &AtomicU64,
    log: &mut RefusalLog,
) -> anyhow::Result<()> {
    let request = match zap.recv_multipart(zmq::DONTWAIT) {
        Ok(r) => r,
        Err(zmq::Error::EAGAIN | zmq::Error::EINTR) => return Ok(()),
        Err(e) => return Err(e).context("reading a request"),
    };
    let verdict = judge(&request, token);
    if verdict.status != "200" {
        let n = refused.fetch_add(1, Ordering::Relaxed) + 1;
        let from = if verdict.address.is_empty() {
            "a peer of unknown address"
        } else {
            &verdict.address
        };
        log.refused(from, verdict.text, n);
    }
    // A REP socket must answer before it takes the next request.
    zap.send_multipart(verdict.reply(), 0)
        .context("answering a request")
}

/// A peer's watch on its connection's handshakes (a socket monitor): a
/// refused token is an error with the reason; other failures are kept, to
/// name when no welcome comes.
pub(super) struct HandshakeWatch {
    /// The PAIR socket the monitored socket's events arrive on.
    events: zmq::Socket,
    /// The last handshake failure other than a refusal, in words.
    last_failure: Option<String>,
    /// Failures already warned about (each is logged once).
    warned: HashSet<String>,
}

impl HandshakeWatch {
    /// Watches `socket`'s handshakes; call it before `socket` connects, so
    /// that no event is missed.
    pub(super) fn new(ctx: &zmq::Context, socket: &zmq::Socket) -> anyhow::Result<Self> {
        let events = monitor(
            ctx,
            socket,
            &[
                zmq::SocketEvent::HANDSHAKE_FAILED_AUTH,
                zmq::SocketEvent::HANDSHAKE_FAILED_PROTOCOL,
                zmq::SocketEvent::HANDSHAKE_FAILED_NO_DETAIL,
            ],
            "the connection's handshakes",
        )?;
        Ok(HandshakeWatch {
            events,
            last_failure: None,
            warned: HashSet::new(),
        })
    }

    /// Reads the events so far: an error naming the cause when the
    /// learner refused this peer's token.
    pub(super) fn check(&mut self) -> anyhow::Result<()> {
        while let Some((event, value, _)) = next_event(&self.events)? {
            let failure = if event == zmq::SocketEvent::HANDSHAKE_FAILED_AUTH.to_raw() {
                anyhow::bail!(
                    "the learner refused our cluster token at the connection's handshake: {}",
                    match value {
                        400 => "wrong cluster token".to_string(),
                        v => format!("ZAP status {v}"),
                    }
                );
            } else if event == zmq::SocketEvent::HANDSHAKE_FAILED_PROTOCOL.to_raw() {
                if value == MECHANISM_MISMATCH {
                    "the learner takes no PLAIN credentials (ZeroMQ security mechanisms differ: \
                     a learner of an older embshard?)"
                        .to_string()
                } else {
                    format!(
                        "ZeroMQ protocol error {value:#x} (is it a learner that listens there?)"
                    )
                }
            } else {
                // A connection lost while it shook hands (a learner that
                // stopped, say): no cause to warn about.
                format!("the connection dropped during the handshake (errno {value})")
            };
            if event != zmq::SocketEvent::HANDSHAKE_FAILED_NO_DETAIL.to_raw()
                && self.warned.insert(failure.clone())
            {
                tracing::warn!("a connection to the learner failed at its handshake: {failure}");
            } else {
                tracing::debug!("a connection to the learner failed at its handshake: {failure}");
            }
            self.last_failure = Some(failure);
        }
        Ok(())
    }

    /// The last handshake failure other than a refusal, in words.
    pub(super) fn last_failure(&self) -> Option<&str> {
        self.last_failure.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ZAP request, as libzmq sends it, from 10.1.2.3 with id "7".
    fn request(mechanism: &str, credentials: &[&str]) -> Vec<Vec<u8>> {
        let mut r: Vec<Vec<u8>> = ["1.0", "7", ZAP_DOMAIN, "10.1.2.3", "embs", mechanism]
            .iter()
            .map(|s| s.as_bytes().to_vec())
            .collect();
        r.extend(credentials.iter().map(|s| s.as_bytes().to_vec()));
        r
    }

    #[test]
    fn only_plain_with_the_token_is_admitted() {
        let ok = judge(&request("PLAIN", &["anyone", "s3cret"]), "s3cret");
        assert_eq!((ok.status, ok.user.as_slice()), ("200", &b"anyone"[..]));
        assert_eq!(ok.reply()[1], b"7");
        assert_eq!(ok.address, "10.1.2.3");
        for (mechanism, credentials) in [
            ("PLAIN", &["embshard", "s3creT"][..]),
            ("PLAIN", &["embshard", ""]),
            ("PLAIN", &["embshard"]),
            ("PLAIN", &["embshard", "s3cret", "more"]),
            ("NULL", &[]),
            ("CURVE", &["s3cret"]),
        ] {
            let v = judge(&request(mechanism, credentials), "s3cret");
            assert_eq!(v.status, "400", "{mechanism} {credentials:?}");
            assert!(v.user.is_empty());
            assert_eq!(v.reply()[1], b"7", "the request id is echoed");
        }
        let mut bad_version = request("PLAIN", &["embshard", "s3cret"]);
        bad_version[0] = b"2.0".to_vec();
        assert_eq!(judge(&bad_version, "s3cret").status, "500");
        assert_eq!(judge(&[], "s3cret").status, "500");
        // A password that is not UTF-8 is just wrong.
        let mut binary = request("PLAIN", &["embshard"]);
        binary.push(vec![0xff, 0xfe]);
        assert_eq!(judge(&binary, "s3cret").status, "400");
    }

    #[test]
    fn tokens_plain_cannot_carry_are_named() {
        assert!(check_token("x").is_ok());
        assert!(check_token(&"x".repeat(MAX_TOKEN_BYTES)).is_ok());
        for bad in [String::new(), "x".repeat(MAX_TOKEN_BYTES + 1)] {
            let e = check_token(&bad).unwrap_err().to_string();
            assert!(e.contains("PLAIN") && e.contains("255"), "{e}");
        }
    }
}
