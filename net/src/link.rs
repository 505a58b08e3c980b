//! ZeroMQ sockets speaking the [`protocol`](crate::protocol): a [`Link`]
//! (DEALER) for actors and benchworkers, a [`Hub`] (ROUTER) for the learner.
//! The endpoint decides the transport — `inproc://` between threads of one
//! process (one shared [`zmq::Context`]), `ipc://` or `tcp://` between
//! processes — and nothing else changes.
//!
//! Frames that do not decode are counted by reason in `drops` and skipped;
//! receiving never fails on bad input, only on a broken socket.
//!
//! Over `tcp://` and `ipc://` the cluster token is checked at each
//! connection's handshake (ZeroMQ PLAIN and a ZAP handler, see `link/auth.rs`):
//! a peer without it gets no message through. The hello's token is checked
//! as well, and is the only check between threads (`inproc://`).

mod auth;

pub use auth::RESERVED_FILES;

pub use auth::MAX_TOKEN_BYTES;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::protocol::{decode, encode, DropCounts, Header, Message, Role, MAX_FRAME_BYTES};
use common::config::Config;
use common::Task;

/// A peer's routing id: its process's incarnation (random, never zero)
/// behind a tag (ZeroMQ reserves ids that start with a zero byte).
fn routing_id(incarnation: u64) -> Vec<u8> {
    let mut id = b"embs".to_vec();
    id.extend_from_slice(&incarnation.to_le_bytes());
    id
}

/// A connection that has not finished its handshake this long after it
/// opened is closed (libzmq's default is 30 s): connections that say
/// nothing cannot pile up and take the learner's file descriptors.
pub const HANDSHAKE_MS: i32 = 5000;

fn configure(socket: &zmq::Socket) -> anyhow::Result<()> {
    socket.set_linger(0)?;
    socket.set_handshake_ivl(HANDSHAKE_MS)?;
    // libzmq closes a tcp connection whose peer sends a bigger message.
    socket.set_maxmsgsize(MAX_FRAME_BYTES as i64)?;
    Ok(())
}

/// Whether a message waits on `socket`, waiting at most `timeout_ms`. A
/// signal (Ctrl-C) that interrupts the wait is not an error: the caller's
/// loop gets to look at its stop flag.
fn readable(socket: &zmq::Socket, timeout_ms: i64) -> anyhow::Result<bool> {
    match socket.poll(zmq::POLLIN, timeout_ms) {
        Ok(n) => Ok(n > 0),
        Err(zmq::Error::EINTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The sending side's envelope fields.
#[derive(Debug, Clone, Copy)]
struct Envelope {
    sender: u64,
    incarnation: u64,
    seq: u64,
}

impl Envelope {
    fn next(&mut self, policy_version: u64) -> Header {
        self.seq += 1;
        Header {
            sender: self.sender,
            incarnation: self.incarnation,
            seq: self.seq,
            policy_version,
        }
    }
}

/// A peer's connection to the learner.
pub struct Link {
    socket: zmq::Socket,
    /// The connection's handshakes, watched where it has any (not over
    /// `inproc://`) and a token is given.
    handshakes: Option<auth::HandshakeWatch>,
    envelope: Envelope,
    last_heard: Instant,
    last_sent: Instant,
    /// Where the learner is, for messages.
    endpoint: String,
    /// Frames received and dropped, by reason.
    pub drops: DropCounts,
    warner: crate::warn::Warner,
}

/// Checks an endpoint's form before libzmq sees it (libzmq says only
/// "Invalid argument" or "No such device"): `tcp://HOST:PORT`,
/// `ipc://PATH` or `inproc://NAME`. A learner `binding` it listens on an
/// IPv4 address, `*` or an interface of this host (not a host name), at a
/// port in 0..=65535 (0: any free one); a peer connects to a host name or
/// address at a port in 1..=65535.
pub fn check_endpoint(endpoint: &str, binding: bool) -> anyhow::Result<()> {
    let form = "an endpoint is tcp://HOST:PORT (or ipc://PATH, inproc://NAME)";
    let Some((scheme, rest)) = endpoint.split_once("://") else {
        anyhow::bail!("`{endpoint}`: {form}");
    };
    match scheme {
        "ipc" | "inproc" => {
            anyhow::ensure!(!rest.is_empty(), "`{endpoint}`: {form}");
            return Ok(());
        }
        "tcp" => {}
        _ => anyhow::bail!(
            "`{endpoint}`: the transport `{scheme}` is not one embshard uses ({form})"
        ),
    }
    let Some((host, port)) = rest.rsplit_once(':') else {
        anyhow::bail!("`{endpoint}`: no port ({form})");
    };
    let lowest = if binding { 0 } else { 1 };
    let port_ok = (binding && port == "*")
        || port
            .parse::<u32>()
            .is_ok_and(|p| (lowest..=65535).contains(&p));
    anyhow::ensure!(
        port_ok,
        "`{endpoint}`: the port `{port}` is not in {lowest}..=65535{}",
        if binding { " (0: any free port)" } else { "" }
    );
    anyhow::ensure!(!host.is_empty(), "`{endpoint}`: no host ({form})");
    if binding
        && host != "*"
        && host.parse::<std::net::Ipv4Addr>().is_err()
        && !std::path::Path::new("/sys/class/net").join(host).exists()
    {
        anyhow::bail!(
            "`{endpoint}`: the learner listens on an IPv4 address of this host, `*` or one of its \
             interfaces (eth0), not on `{host}`{}",
            if host == "localhost" {
                ": use 127.0.0.1"
            } else {
                ""
            }
        );
    }
    Ok(())
}

/// What a peer learns from the learner's welcome.
#[derive(Debug, Clone)]
pub struct Welcome {
    pub peer: u64,
    pub config: Config,
    pub tasks: Vec<Task>,
}

impl Link {
    /// Connects to the learner at `endpoint`; nothing is sent yet. With a
    /// `token`, the connection presents it at its handshake (as its PLAIN
    /// password), which a learner over `tcp://` or `ipc://` requires; a
    /// refusal there is an error of [`Link::register`] and [`Link::tend`].
    pub fn connect(
        ctx: &zmq::Context,
        endpoint: &str,
        token: Option<&str>,
    ) -> anyhow::Result<Link> {
        check_endpoint(endpoint, false).context("--learner")?;
        let socket = ctx.socket(zmq::DEALER)?;
        configure(&socket)?;
        let mut handshakes = None;
        if let Some(token) = token {
            auth::check_token(token)?;
            socket.set_plain_username(Some(auth::PLAIN_USER))?;
            socket.set_plain_password(Some(token))?;
            if !endpoint.starts_with("inproc://") {
                handshakes = Some(auth::HandshakeWatch::new(ctx, &socket)?);
            }
        }
        // Queue nothing while the learner is away: what it would get on
        // reconnecting is stale (a restarted learner says hello anew).
        socket.set_immediate(true)?;
        // The learner knows a peer by its connection's routing id: one of
        // this process's own keeps it the same peer when libzmq reconnects
        // after a dropped connection (the hub hands the id over), so what
        // it sends then (a measurement in progress) still counts.
        let incarnation = crate::protocol::new_incarnation();
        socket.set_identity(&routing_id(incarnation))?;
        socket
            .connect(endpoint)
            .with_context(|| format!("connecting to the learner at {endpoint}"))?;
        Ok(Link {
            socket,
            handshakes,
            envelope: Envelope {
                sender: 0,
                incarnation,
                seq: 0,
            },
            last_heard: Instant::now(),
            last_sent: Instant::now(),
            endpoint: endpoint.to_string(),
            drops: DropCounts::default(),
            warner: crate::warn::Warner::default(),
        })
    }

    /// The id the learner gave this peer (0 before its welcome).
    pub fn set_sender(&mut self, id: u64) {
        self.envelope.sender = id;
    }

    /// How long since anything came from the learner.
    pub fn silence(&self) -> Duration {
        self.last_heard.elapsed()
    }

    /// Sends a heartbeat if nothing was sent for `every`.
    pub fn heartbeat(&mut self, every: Duration) -> anyhow::Result<()> {
        if self.last_sent.elapsed() >= every {
            self.send(0, &Message::Heartbeat)?;
        }
        Ok(())
    }

    /// An error naming the cause if the learner refused this peer's token
    /// at a handshake since the last look.
    pub fn check_handshakes(&mut self) -> anyhow::Result<()> {
        match &mut self.handshakes {
            Some(watch) => watch.check(),
            None => Ok(()),
        }
    }

    /// One turn of a peer's loop: the end of the stay if `stop` is set or
    /// the learner has been silent for `timeout`, otherwise a heartbeat if
    /// one is due and `None`. An error if the learner refused this peer's
    /// token at a handshake (a reconnection to a learner with another).
    pub fn tend(
        &mut self,
        stop: &AtomicBool,
        heartbeat: Duration,
        timeout: Duration,
    ) -> anyhow::Result<Option<End>> {
        if stop.load(Ordering::Relaxed) {
            return Ok(Some(End::Stop));
        }
        self.check_handshakes()?;
        if self.silence() > timeout {
            return Ok(Some(End::LostLearner));
        }
        self.heartbeat(heartbeat)?;
        Ok(None)
    }

    /// Says hello (again every two seconds) until the learner welcomes this
    /// peer. `None`: `stop` was set or the learner said `Shutdown` first.
    /// A refusal for good (a wrong token, at the handshake or in answer to
    /// the hello) or no welcome within `wait` is an error.
    pub fn register(
        &mut self,
        role: Role,
        token: &str,
        wait: Duration,
        stop: &AtomicBool,
    ) -> anyhow::Result<Option<Welcome>> {
        let start = Instant::now();
        let hello = Message::Hello {
            role,
            token: token.to_string(),
        };
        let mut said = None::<Instant>;
        let mut reminded = 0;
        loop {
            if stop.load(Ordering::Relaxed) {
                return Ok(None);
            }
            self.check_handshakes()?;
            if start.elapsed() >= wait {
                let failed = self.handshakes.as_ref().and_then(|w| w.last_failure());
                anyhow::bail!(
                    "no welcome from the learner within {wait:?}{}",
                    failed
                        .map(|f| format!(" (the last connection failed at its handshake: {f})"))
                        .unwrap_or_default()
                );
            }
            if said.is_none_or(|t| t.elapsed() >= Duration::from_secs(2)) {
                self.send(0, &hello)?;
                said = Some(Instant::now());
            }
            // Waiting is said, then every half minute: a wrong endpoint
            // must not look like a hang.
            let waited = start.elapsed().as_secs();
            if waited >= 5 && reminded < waited / 30 + 1 {
                reminded = waited / 30 + 1;
                tracing::info!(
                    "waiting for the learner at {} ({waited} s so far; giving up after {} s: --wait-s)",
                    self.endpoint,
                    wait.as_secs()
                );
            }
            match self.recv(100)? {
                Some((
                    _,
                    Message::Welcome {
                        peer,
                        config_toml,
                        tasks,
                    },
                )) => {
                    self.set_sender(peer);
                    let config = Config::from_toml(&config_toml, std::path::Path::new("<welcome>"))
                        .context("the learner's configuration")?;
                    return Ok(Some(Welcome {
                        peer,
                        config,
                        tasks,
                    }));
                }
                Some((_, Message::Refused { reason, retry })) => {
                    anyhow::ensure!(retry, "the learner refused this {role:?}: {reason}");
                }
                Some((_, Message::Shutdown)) => return Ok(None),
                _ => {}
            }
        }
    }

    /// Sends to the learner; false when it is not connected (the message
    /// is dropped).
    pub fn send(&mut self, policy_version: u64, message: &Message) -> anyhow::Result<bool> {
        let frame = encode(&self.envelope.next(policy_version), message);
        anyhow::ensure!(
            frame.len() <= MAX_FRAME_BYTES,
            "a {:?} of {} bytes exceeds the frame limit of {MAX_FRAME_BYTES}",
            message.kind(),
            frame.len()
        );
        match self.socket.send(frame, zmq::DONTWAIT) {
            Ok(()) => {
                self.last_sent = Instant::now();
                Ok(true)
            }
            Err(zmq::Error::EAGAIN) => Ok(false),
            Err(e) => Err(e).context("sending to the learner"),
        }
    }

    /// The next message that decodes, waiting at most `timeout_ms` (0: do
    /// not wait; -1: wait for ever).
    pub fn recv(&mut self, timeout_ms: i64) -> anyhow::Result<Option<(Header, Message)>> {
        loop {
            if !readable(&self.socket, timeout_ms)? {
                return Ok(None);
            }
            let frame = self.socket.recv_bytes(0)?;
            match decode(&frame) {
                Ok(m) => {
                    self.last_heard = Instant::now();
                    return Ok(Some(m));
                }
                Err(e) => {
                    let now = Instant::now();
                    let said = || format!("dropped a frame from the learner: {e}");
                    self.warner.warn(e.label(), now, said);
                    self.drops.add(e.label());
                }
            }
        }
    }
}

/// `secs` seconds as a [`Duration`], or an error naming `what` (an option,
/// a setting) for a value that is not a positive number of seconds a
/// `Duration` can hold: NaN, infinite, zero, negative, or above about
/// 1.8e19 (where `Duration::from_secs_f64` panics).
pub fn seconds(what: &str, secs: f64) -> anyhow::Result<Duration> {
    match Duration::try_from_secs_f64(secs) {
        Ok(d) if secs > 0.0 => Ok(d),
        _ => anyhow::bail!(
            "{what} must be a positive number of seconds below {:.1e}, not {secs}",
            u64::MAX as f64
        ),
    }
}

/// Raises this process's soft limit on open files to its hard limit: a
/// learner holds a descriptor per connection, and the common soft limit of
/// 1024 was exhausted by about 1000 idle connections, which stopped
/// training. Returns the limit now in force (`None`: unknown, unlimited).
pub fn raise_open_files() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            tracing::debug!("the open-files limit stays: {e}");
        }
    }
    getrlimit(Resource::Nofile).current
}

/// Which stop signals came: SIGINT's flag and SIGTERM's.
static SIGNALLED: std::sync::OnceLock<[std::sync::Arc<AtomicBool>; 2]> = std::sync::OnceLock::new();

/// A flag that Ctrl-C (SIGINT) or SIGTERM sets, for a clean stop. Each
/// call gets its own flag; [`stop_signal`] says which signal came.
pub fn stop_on_signal() -> std::sync::Arc<AtomicBool> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let signalled = SIGNALLED.get_or_init(|| {
        let flags = [
            std::sync::Arc::new(AtomicBool::new(false)),
            std::sync::Arc::new(AtomicBool::new(false)),
        ];
        for (sig, flag) in [SIGINT, SIGTERM].into_iter().zip(&flags) {
            if let Err(e) = signal_hook::flag::register(sig, flag.clone()) {
                tracing::debug!("no handler for signal {sig}: {e}");
            }
        }
        flags
    });
    for sig in [SIGINT, SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            tracing::debug!("no handler for signal {sig}: {e}");
        }
    }
    // A signal that came before this call stops this flag's holder too.
    if signalled.iter().any(|f| f.load(Ordering::Relaxed)) {
        stop.store(true, Ordering::Relaxed);
    }
    stop
}

/// The exit status the shell gives a process a stop signal ended:
/// 128 + the signal, 130 after SIGINT, 143 after SIGTERM (SIGTERM first
/// where both came); `None` before either.
pub fn stop_signal() -> Option<u8> {
    let [int, term] = SIGNALLED.get()?;
    if term.load(Ordering::Relaxed) {
        Some(128 + signal_hook::consts::SIGTERM as u8)
    } else if int.load(Ordering::Relaxed) {
        Some(128 + signal_hook::consts::SIGINT as u8)
    } else {
        None
    }
}

/// The environment variable that may hold the cluster token.
pub const TOKEN_ENV: &str = "EMBSHARD_TOKEN";

/// The cluster token from `file` (trimmed), else from `EMBSHARD_TOKEN`;
/// `None` when neither is given. Tokens never travel on command lines,
/// where every user of the host can read them.
pub fn read_token(file: Option<&std::path::Path>) -> anyhow::Result<Option<String>> {
    let (token, from) = match file {
        Some(f) => (
            std::fs::read_to_string(f)
                .with_context(|| format!("reading the cluster token from {}", f.display()))?,
            f.display().to_string(),
        ),
        None => match std::env::var(TOKEN_ENV) {
            Ok(t) => (t, TOKEN_ENV.to_string()),
            Err(_) => return Ok(None),
        },
    };
    let token = token.trim().to_string();
    anyhow::ensure!(!token.is_empty(), "the cluster token in {from} is empty");
    auth::check_token(&token).with_context(|| format!("the cluster token in {from}"))?;
    Ok(Some(token))
}

/// Whether a presented token is the cluster's, in time that does not
/// depend on where they first differ (the digests are compared whole, so a
/// peer cannot learn the token a byte at a time from how fast it is
/// refused).
pub fn tokens_match(presented: &str, cluster: &str) -> bool {
    use sha2::Digest as _;
    let (a, b) = (
        sha2::Sha256::digest(presented.as_bytes()),
        sha2::Sha256::digest(cluster.as_bytes()),
    );
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// A cluster token's fingerprint, to recognise the token later without
/// keeping it: `sha256:` and the token's SHA-256 in hex.
pub fn token_fingerprint(token: &str) -> String {
    use sha2::Digest as _;
    format!("sha256:{:x}", sha2::Sha256::digest(token.as_bytes()))
}

/// A new random cluster token.
pub fn random_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Writes a token file readable by its owner only, whole or not at all.
pub fn write_token(path: &std::path::Path, token: &str) -> anyhow::Result<()> {
    common::fs::write_private(path, format!("{token}\n").as_bytes())?;
    Ok(())
}

/// How a stay with a learner ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Told to stop, or `stop` was set.
    Stop,
    /// The learner went silent or forgot this peer: say hello again.
    LostLearner,
}

/// A peer's life: say hello, run `session` with the welcome, and when the
/// learner is lost, say hello again — until a session ends with
/// [`End::Stop`]. Returns how many welcomes followed the first (the
/// learner restarted or lost this peer).
pub fn sessions(
    ctx: &zmq::Context,
    endpoint: &str,
    role: Role,
    token: &str,
    wait: Duration,
    stop: &AtomicBool,
    mut session: impl FnMut(&mut Link, &Welcome) -> anyhow::Result<End>,
) -> anyhow::Result<u64> {
    let mut link = Link::connect(ctx, endpoint, Some(token))?;
    let mut welcomes = 0u64;
    loop {
        let Some(welcome) = link
            .register(role, token, wait, stop)
            .with_context(|| format!("{role:?} of the learner at {endpoint}"))?
        else {
            return Ok(welcomes.saturating_sub(1));
        };
        welcomes += 1;
        tracing::info!("{role:?} {} joined the learner", welcome.peer);
        if session(&mut link, &welcome)? == End::Stop {
            return Ok(welcomes - 1);
        }
        tracing::warn!("the learner is silent; saying hello again");
    }
}

/// A received message and who sent it.
pub struct Incoming {
    /// ZeroMQ's routing id of the connection: where replies go.
    pub from: Vec<u8>,
    pub header: Header,
    pub message: Message,
}

/// The learner's socket: every peer connects here.
pub struct Hub {
    socket: zmq::Socket,
    /// Checks the token of connections over `tcp://` and `ipc://`; dropped
    /// after the socket (fields drop in order), and stopped then.
    zap: Option<auth::ZapHandler>,
    envelope: Envelope,
    /// Frames received and dropped, by reason.
    pub drops: DropCounts,
    warner: crate::warn::Warner,
}

impl Hub {
    /// Binds `endpoint` (for example `inproc://learner` or
    /// `tcp://127.0.0.1:5555`). With a cluster `token`, connections over
    /// `tcp://` and `ipc://` (to this endpoint and any bound later) must
    /// present it at their handshake, as their PLAIN password, to a ZAP
    /// handler started here on `ctx` (one per context): others are refused
    /// before any of their messages arrives, and counted
    /// ([`Hub::refused_handshakes`]). `inproc://` connections have no
    /// handshake. Without a token only `inproc://` endpoints may be bound.
    pub fn bind(ctx: &zmq::Context, endpoint: &str, token: Option<&str>) -> anyhow::Result<Hub> {
        let socket = ctx.socket(zmq::ROUTER)?;
        configure(&socket)?;
        // The handler answers before the first connection can ask.
        let zap = match token {
            Some(token) => {
                let zap = auth::ZapHandler::start(ctx, token, &socket)?;
                socket.set_plain_server(true)?;
                socket.set_zap_domain(auth::ZAP_DOMAIN)?;
                Some(zap)
            }
            None => None,
        };
        // Closing still delivers what is queued (the final shutdown) for a while.
        socket.set_linger(2000)?;
        // A reply to a peer that has gone is an error, not a silent drop.
        socket.set_router_mandatory(true)?;
        // A peer that reconnects (its routing id is its own, see
        // `Link::connect`) takes its id over from the stale connection.
        socket.set_router_handover(true)?;
        let hub = Hub {
            socket,
            zap,
            envelope: Envelope {
                sender: 0,
                incarnation: crate::protocol::new_incarnation(),
                seq: 0,
            },
            drops: DropCounts::default(),
            warner: crate::warn::Warner::default(),
        };
        hub.bind_endpoint(endpoint)?;
        Ok(hub)
    }

    /// Binds one more endpoint; returns it as bound (a `tcp://…:0`
    /// request gets its port).
    pub fn bind_also(&mut self, endpoint: &str) -> anyhow::Result<String> {
        self.bind_endpoint(endpoint)?;
        self.socket
            .get_last_endpoint()?
            .map_err(|_| anyhow::anyhow!("the bound endpoint is not UTF-8"))
    }

    /// Binds `endpoint`, unless it would take connections that no token
    /// is checked on.
    fn bind_endpoint(&self, endpoint: &str) -> anyhow::Result<()> {
        check_endpoint(endpoint, true)
            .with_context(|| format!("binding the learner to {endpoint}"))?;
        anyhow::ensure!(
            self.zap.is_some() || endpoint.starts_with("inproc://"),
            "binding the learner to {endpoint} without a cluster token: anyone who reaches it \
             could send to the learner"
        );
        self.socket
            .bind(endpoint)
            .with_context(|| format!("binding the learner to {endpoint}"))
    }

    /// Connections over `tcp://` or `ipc://` refused at their handshake so
    /// far: each that gave another token, and each that gave none where
    /// libzmq reports it (not when the peer drops the connection before
    /// the learner reads its greeting).
    pub fn refused_handshakes(&self) -> u64 {
        self.zap.as_ref().map_or(0, auth::ZapHandler::refused)
    }

    /// Connections open now over `tcp://` and `ipc://`, said hello or not
    /// (`inproc://` ones are not counted).
    pub fn open_connections(&self) -> u64 {
        self.zap.as_ref().map_or(0, auth::ZapHandler::open)
    }

    /// Connections closed as they came because the cap was reached.
    pub fn shed_connections(&self) -> u64 {
        self.zap.as_ref().map_or(0, auth::ZapHandler::shed)
    }

    /// The most connections over `tcp://` and `ipc://` kept open: by
    /// default the open-files limit in force less [`RESERVED_FILES`] (at
    /// least 64; none where the limit is unlimited), so that a flood of
    /// connections does not take the descriptors the learner's own files
    /// need. A connection
    /// beyond it is closed as it comes (a peer of the cluster connects
    /// again by itself). `None` without a token (`inproc://` only).
    pub fn connection_cap(&self) -> Option<u64> {
        self.zap.as_ref().map(auth::ZapHandler::cap)
    }

    /// Sets the cap of [`Hub::connection_cap`] (0: the default).
    pub fn set_connection_cap(&self, cap: u64) {
        if let Some(zap) = &self.zap {
            zap.set_cap(cap);
        }
    }

    /// Sends to one peer; false when the peer is gone.
    pub fn send(&mut self, to: &[u8], policy_version: u64, message: &Message) -> bool {
        let frame = encode(&self.envelope.next(policy_version), message);
        if frame.len() > MAX_FRAME_BYTES {
            // Not the peer's fault: it stays.
            tracing::error!(
                "a {:?} of {} bytes exceeds the frame limit of {MAX_FRAME_BYTES}: not sent",
                message.kind(),
                frame.len()
            );
            return true;
        }
        self.socket
            .send_multipart([to, frame.as_slice()], zmq::DONTWAIT)
            .is_ok()
    }

    /// Waits at most `timeout_ms` for a frame on the hub or on `other` (a
    /// socket that wakes the hub's thread); returns whether `other` has
    /// one, after taking every frame it has.
    pub fn wait_with(&self, other: &zmq::Socket, timeout_ms: i64) -> anyhow::Result<bool> {
        let mut items = [
            self.socket.as_poll_item(zmq::POLLIN),
            other.as_poll_item(zmq::POLLIN),
        ];
        match zmq::poll(&mut items, timeout_ms) {
            Ok(_) | Err(zmq::Error::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
        let woken = items[1].is_readable();
        while other.recv_bytes(zmq::DONTWAIT).is_ok() {}
        Ok(woken)
    }

    /// The next message that decodes, waiting at most `timeout_ms`.
    pub fn recv(&mut self, timeout_ms: i64) -> anyhow::Result<Option<Incoming>> {
        loop {
            if !readable(&self.socket, timeout_ms)? {
                return Ok(None);
            }
            // Part by part: a message of many parts is dropped as its parts
            // come, never held whole (each part is capped, their number
            // is not).
            let from = self.socket.recv_bytes(0)?;
            let frame = match self.socket.get_rcvmore()? {
                true => self.socket.recv_bytes(0)?,
                false => Vec::new(),
            };
            let mut parts = 2;
            while self.socket.get_rcvmore()? {
                drop(self.socket.recv_bytes(0)?);
                parts += 1;
            }
            if parts != 2 || frame.is_empty() {
                let now = Instant::now();
                let said = || format!("dropped a message of {parts} parts (a peer sends 2)");
                self.warner.warn("multipart", now, said);
                self.drops.add("multipart");
                continue;
            }
            match decode(&frame) {
                Ok((header, message)) => {
                    return Ok(Some(Incoming {
                        from,
                        header,
                        message,
                    }))
                }
                Err(e) => {
                    let now = Instant::now();
                    self.warner
                        .warn(e.label(), now, || format!("dropped a frame: {e}"));
                    self.drops.add(e.label());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_checked_before_libzmq_with_what_is_wrong() {
        for ok in [
            "tcp://127.0.0.1:0",
            "tcp://*:5555",
            "tcp://lo:65535",
            "inproc://x",
            "ipc:///tmp/s",
        ] {
            check_endpoint(ok, true).unwrap();
        }
        for ok in ["tcp://gpu-host-3:5555", "tcp://10.0.0.5:1"] {
            check_endpoint(ok, false).unwrap();
        }
        for (bad, binding, words) in [
            ("127.0.0.1:5555", true, &["tcp://HOST:PORT"][..]),
            ("tcp://127.0.0.1:70000", true, &["70000", "0..=65535"]),
            ("tcp://127.0.0.1:0", false, &["1..=65535"]),
            ("tcp://127.0.0.1", false, &["no port"]),
            ("tcp://:5555", false, &["no host"]),
            ("tcp://localhost:0", true, &["use 127.0.0.1"]),
            (
                "tcp://no-such-interface0:0",
                true,
                &["not on `no-such-interface0`"],
            ),
            ("udp://1.2.3.4:5", false, &["udp"]),
        ] {
            let e = check_endpoint(bad, binding).unwrap_err().to_string();
            for w in words {
                assert!(e.contains(w), "{bad}: {w:?} not in {e}");
            }
        }
    }

    #[test]
    fn the_open_files_limit_is_raised_to_the_hard_one() {
        use rustix::process::{getrlimit, Resource};
        let now = raise_open_files();
        assert_eq!(now, getrlimit(Resource::Nofile).current);
        assert_eq!(now, getrlimit(Resource::Nofile).maximum);
    }

    /// Connections that open and say nothing are counted, and closed once
    /// their handshake has waited [`HANDSHAKE_MS`]: they cannot pile up and
    /// take the learner's file descriptors.
    #[test]
    fn idle_connections_are_counted_and_closed_after_the_handshake_timeout() {
        let ctx = zmq::Context::new();
        let mut hub = Hub::bind(&ctx, "inproc://idle-test", Some("t")).unwrap();
        let endpoint = hub.bind_also("tcp://127.0.0.1:0").unwrap();
        let addr = endpoint.trim_start_matches("tcp://").to_string();
        let idle: Vec<std::net::TcpStream> = (0..20)
            .map(|_| std::net::TcpStream::connect(&addr).unwrap())
            .collect();
        let start = Instant::now();
        while hub.open_connections() < 20 {
            assert!(
                start.elapsed() < Duration::from_secs(4),
                "{}",
                hub.open_connections()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        while hub.open_connections() > 0 {
            let waited = start.elapsed();
            assert!(
                waited < Duration::from_secs(15),
                "still open after {waited:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(start.elapsed() >= Duration::from_millis(HANDSHAKE_MS as u64 - 500));
        drop(idle);
    }

    /// Connections beyond the cap are closed as they come, long before the
    /// handshake timeout, and counted: a flood of them cannot take the
    /// descriptors the learner's own files need.
    #[test]
    fn connections_beyond_the_cap_are_closed_at_once() {
        use std::io::Read as _;
        let ctx = zmq::Context::new();
        let hub = Hub::bind(&ctx, "inproc://cap-test", Some("t")).unwrap();
        let default = hub.connection_cap().unwrap();
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        assert_eq!(
            default,
            limit.map_or(u64::MAX, |n| n.saturating_sub(RESERVED_FILES).max(64))
        );
        hub.set_connection_cap(10);
        assert_eq!(hub.connection_cap(), Some(10));
        let mut hub = hub;
        let endpoint = hub.bind_also("tcp://127.0.0.1:0").unwrap();
        let addr = endpoint.trim_start_matches("tcp://").to_string();
        let start = Instant::now();
        let mut idle: Vec<std::net::TcpStream> = (0..30)
            .map(|_| std::net::TcpStream::connect(&addr).unwrap())
            .collect();
        while hub.shed_connections() < 20 {
            assert!(
                start.elapsed() < Duration::from_millis(HANDSHAKE_MS as u64 / 2),
                "{} shed, {} open",
                hub.shed_connections(),
                hub.open_connections()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(hub.shed_connections(), 20);
        while hub.open_connections() > 10 {
            assert!(start.elapsed() < Duration::from_millis(HANDSHAKE_MS as u64 / 2));
            std::thread::sleep(Duration::from_millis(20));
        }
        // The shed ones read the end of their stream; the others are open.
        let mut ended = 0;
        for s in &mut idle {
            s.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            let mut buf = [0u8; 256];
            loop {
                match s.read(&mut buf) {
                    Ok(0) => {
                        ended += 1;
                        break;
                    }
                    Ok(_) => continue,
                    Err(_) => break,
                }
            }
        }
        assert_eq!(ended, 20);
        assert!(start.elapsed() < Duration::from_millis(HANDSHAKE_MS as u64));
    }

    #[test]
    fn tokens_match_only_themselves() {
        assert!(tokens_match("s3cret", "s3cret"));
        for other in ["s3creT", "s3cre", "s3cret ", "", "x"] {
            assert!(!tokens_match(other, "s3cret"), "{other:?}");
        }
    }

    #[test]
    fn a_tokens_fingerprint_is_its_sha256_and_an_empty_token_file_is_named() {
        // FIPS 180-2's example.
        assert_eq!(
            token_fingerprint("abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, " secret\n").unwrap();
        assert_eq!(read_token(Some(&path)).unwrap().as_deref(), Some("secret"));
        std::fs::write(&path, "\n").unwrap();
        let e = read_token(Some(&path)).unwrap_err().to_string();
        assert!(
            e.contains(path.to_str().unwrap()) && e.contains("empty"),
            "{e}"
        );
        // One PLAIN cannot carry: named with its file at once.
        std::fs::write(&path, "x".repeat(auth::MAX_TOKEN_BYTES + 1)).unwrap();
        let e = format!("{:#}", read_token(Some(&path)).unwrap_err());
        assert!(
            e.contains(path.to_str().unwrap()) && e.contains("1 to 255"),
            "{e}"
        );
        // Two tokens in one file: a mistake, named.
        std::fs::write(&path, "one-token\nanother\n").unwrap();
        let e = format!("{:#}", read_token(Some(&path)).unwrap_err());
        assert!(
            e.contains(path.to_str().unwrap()) && e.contains("one line"),
            "{e}"
        );
    }

    #[test]
    fn a_link_and_a_hub_talk_and_garbage_is_counted() {
        let ctx = zmq::Context::new();
        let mut hub = Hub::bind(&ctx, "inproc://link-test", Some("t")).unwrap();
        let mut link = Link::connect(&ctx, "inproc://link-test", Some("t")).unwrap();
        link.send(0, &Message::Heartbeat).unwrap();
        // Garbage from a raw socket, then a valid message from it: inproc
        // has no handshake, so a socket without credentials gets through
        // (to the hello's check) though the hub has a token.
        let raw = ctx.socket(zmq::DEALER).unwrap();
        raw.connect("inproc://link-test").unwrap();
        raw.send(&b"not a frame"[..], 0).unwrap();
        let got = hub.recv(1000).unwrap().unwrap();
        assert_eq!(got.message, Message::Heartbeat);
        assert_eq!(got.header.seq, 1);
        assert!(hub.send(&got.from, 5, &Message::Credit { n: 3 }));
        let (h, m) = link.recv(1000).unwrap().unwrap();
        assert_eq!((h.policy_version, m), (5, Message::Credit { n: 3 }));
        assert!(hub.recv(100).unwrap().is_none());
        assert_eq!(hub.drops.total(), 1);
        assert_eq!(hub.drops.by_reason.get("bad_magic"), Some(&1));
        // A reply to a peer that never existed fails instead of vanishing.
        assert!(!hub.send(b"nobody", 0, &Message::Shutdown));
        // A message of many parts is dropped part by part, counted; the
        // next one gets through.
        let parts: Vec<Vec<u8>> = vec![vec![7u8; 1 << 20]; 8];
        raw.send_multipart(parts, 0).unwrap();
        link.send(0, &Message::Heartbeat).unwrap();
        assert_eq!(hub.recv(1000).unwrap().unwrap().message, Message::Heartbeat);
        assert_eq!(hub.drops.by_reason.get("multipart"), Some(&1));
    }

    #[test]
    fn a_peer_that_reconnects_keeps_its_routing_id() {
        let ctx = zmq::Context::new();
        let mut hub = Hub::bind(&ctx, "inproc://reconnect-test", Some("t")).unwrap();
        let endpoint = hub.bind_also("tcp://127.0.0.1:0").unwrap();
        let mut link = Link::connect(&ctx, &endpoint, Some("t")).unwrap();
        let first = heartbeat_heard(&mut link, &mut hub, 50).expect("the hub never heard the link");
        assert_eq!(first.from, routing_id(link.envelope.incarnation));
        let seq = first.header.seq;
        // A second connection with the same id while the first still
        // stands (a reconnect before the old connection is seen to drop):
        // it takes the id over, and its messages come from the same peer.
        let again = ctx.socket(zmq::DEALER).unwrap();
        again.set_plain_username(Some("x")).unwrap();
        again.set_plain_password(Some("t")).unwrap();
        again.set_identity(&first.from).unwrap();
        again.connect(&endpoint).unwrap();
        let frame = encode(
            &Header {
                sender: 0,
                incarnation: link.envelope.incarnation,
                seq: seq + 100,
                policy_version: 0,
            },
            &Message::Heartbeat,
        );
        let second = (0..50)
            .find_map(|_| {
                again.send(&frame, 0).unwrap();
                hub.recv(100).unwrap().filter(|m| m.header.seq == seq + 100)
            })
            .expect("the hub never heard the second connection");
        assert_eq!(second.from, first.from);
        // Replies go to the new connection.
        assert!(hub.send(&second.from, 0, &Message::Credit { n: 1 }));
        assert_eq!(again.poll(zmq::POLLIN, 2000).unwrap(), 1);
    }

    /// What `hub` received within `ms` milliseconds, heartbeats from
    /// anyone included.
    /// Nothing is queued until a connection stands: `link` says a
    /// heartbeat until `hub` hears something (at most `tries` times, 100
    /// ms apart), and that is returned.
    fn heartbeat_heard(link: &mut Link, hub: &mut Hub, tries: usize) -> Option<Incoming> {
        (0..tries).find_map(|_| {
            let _ = link.send(0, &Message::Heartbeat);
            hub.recv(100).unwrap()
        })
    }

    fn heard(hub: &mut Hub, ms: u64) -> Vec<Message> {
        let start = Instant::now();
        let mut got = Vec::new();
        while start.elapsed() < Duration::from_millis(ms) {
            if let Some(m) = hub.recv(50).unwrap() {
                got.push(m.message);
            }
        }
        got
    }

    /// Over tcp, connections without the cluster token (none, or another)
    /// are refused at their handshake and counted: none of their messages
    /// reaches the hub, not a hello that carries the right token inside,
    /// not a message of many big frames; a link with the right token talks.
    #[test]
    fn over_tcp_only_the_token_gets_a_message_through() {
        let ctx = zmq::Context::new();
        let mut hub = Hub::bind(&ctx, "inproc://auth-test", Some("right")).unwrap();
        let endpoint = hub.bind_also("tcp://127.0.0.1:0").unwrap();
        // Strangers of another process (context).
        let far = zmq::Context::new();
        let hello = encode(
            &Header {
                sender: 0,
                incarnation: 9,
                seq: 1,
                policy_version: 0,
            },
            &Message::Hello {
                role: Role::Actor,
                token: "right".into(),
            },
        );
        let stranger = |password: Option<&str>| {
            let s = far.socket(zmq::DEALER).unwrap();
            s.set_linger(0).unwrap();
            if let Some(p) = password {
                s.set_plain_username(Some("embshard")).unwrap();
                s.set_plain_password(Some(p)).unwrap();
            }
            let watch = auth::HandshakeWatch::new(&far, &s).unwrap();
            s.connect(&endpoint).unwrap();
            // Queued until the connection stands, and sent then; once it is
            // refused, there is nowhere to queue (libzmq does not connect
            // again), hence no waiting.
            let _ = s.send(&b"garbage"[..], zmq::DONTWAIT);
            let _ = s.send(&hello, zmq::DONTWAIT);
            let _ = s.send_multipart(vec![vec![7u8; 1 << 20]; 16], zmq::DONTWAIT);
            (s, watch)
        };
        let refused_within = |hub: &mut Hub, at_least: u64| {
            let start = Instant::now();
            while hub.refused_handshakes() < at_least {
                assert!(start.elapsed() < Duration::from_secs(20), "not refused");
                assert_eq!(hub.recv(50).unwrap().map(|m| m.message), None);
            }
        };
        // The wrong token: refused, and counted (libzmq 4.3 does not
        // connect again after a refusal at the handshake).
        let wrong = stranger(Some("wrong"));
        refused_within(&mut hub, 1);
        // No credentials at all (as a peer of an older version): refused,
        // as the stranger sees; counted only where libzmq reports it (not
        // when the stranger drops the connection first).
        let (none, mut watch) = stranger(None);
        let start = Instant::now();
        while watch.last_failure().is_none() {
            assert!(start.elapsed() < Duration::from_secs(20), "not refused");
            watch.check().unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(heard(&mut hub, 500), [], "a stranger got a message through");
        assert_eq!(hub.drops.total(), 0);
        drop((none, wrong));

        // A link with the wrong token ends at once, with the reason.
        let stop = AtomicBool::new(false);
        let mut link = Link::connect(&far, &endpoint, Some("wrong")).unwrap();
        let start = Instant::now();
        let e = link
            .register(Role::Actor, "wrong", Duration::from_secs(60), &stop)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("refused our cluster token") && e.contains("wrong cluster token"),
            "{e}"
        );
        assert!(start.elapsed() < Duration::from_secs(20), "{e}");
        drop(link);

        // The right token: heard, and answered.
        let mut link = Link::connect(&far, &endpoint, Some("right")).unwrap();
        let got = heartbeat_heard(&mut link, &mut hub, 100)
            .expect("the hub never heard the link with the token");
        assert_eq!(got.message, Message::Heartbeat);
        assert!(hub.send(&got.from, 0, &Message::Credit { n: 1 }));
        let (_, m) = link.recv(5000).unwrap().expect("an answer");
        assert_eq!(m, Message::Credit { n: 1 });
        link.check_handshakes().unwrap();
    }

    /// A link whose learner takes no credentials (a learner of an older
    /// version) names that when no welcome comes; a hub without a token
    /// binds nothing but inproc.
    #[test]
    fn a_learner_without_plain_is_named_and_a_hub_without_a_token_stays_inproc() {
        let ctx = zmq::Context::new();
        let e = Hub::bind(&ctx, "tcp://127.0.0.1:0", None)
            .err()
            .expect("tcp without a token")
            .to_string();
        assert!(e.contains("without a cluster token"), "{e}");
        let mut hub = Hub::bind(&ctx, "inproc://no-token", None).unwrap();
        assert!(hub.bind_also("ipc:///tmp/embshard-no-token").is_err());
        // An old learner: a ROUTER with no security mechanism.
        let old = ctx.socket(zmq::ROUTER).unwrap();
        old.bind("tcp://127.0.0.1:0").unwrap();
        let endpoint = old.get_last_endpoint().unwrap().unwrap();
        let mut link = Link::connect(&ctx, &endpoint, Some("t")).unwrap();
        let stop = AtomicBool::new(false);
        let e = link
            .register(Role::Benchworker, "t", Duration::from_millis(1500), &stop)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no welcome") && e.contains("takes no PLAIN credentials"),
            "{e}"
        );
        assert_eq!(old.poll(zmq::POLLIN, 0).unwrap(), 0, "nothing got through");
        // Tokens PLAIN cannot carry are refused at once.
        let long = "x".repeat(MAX_TOKEN_BYTES + 1);
        assert!(Link::connect(&ctx, &endpoint, Some(&long)).is_err());
        let other = zmq::Context::new();
        assert!(Hub::bind(&other, "inproc://long", Some(&long)).is_err());
    }

    /// One hub with a token per context (they share the ZAP endpoint);
    /// once it is dropped, its handler has stopped and another may bind.
    /// Over ipc, as over tcp, the token is checked at the handshake.
    #[test]
    fn a_dropped_hub_stops_its_zap_handler() {
        let ctx = zmq::Context::new();
        let hub = Hub::bind(&ctx, "inproc://first", Some("t")).unwrap();
        let e = Hub::bind(&ctx, "inproc://second", Some("t"))
            .err()
            .expect("a second ZAP handler")
            .to_string();
        assert!(e.contains("ZAP"), "{e}");
        let start = Instant::now();
        drop(hub);
        assert!(start.elapsed() < Duration::from_secs(2));
        let mut hub = Hub::bind(&ctx, "inproc://second", Some("t")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let endpoint = format!("ipc://{}", dir.path().join("hub").display());
        hub.bind_also(&endpoint).unwrap();
        let mut wrong = Link::connect(&ctx, &endpoint, Some("wrong")).unwrap();
        let stop = AtomicBool::new(false);
        let e = wrong
            .register(Role::Actor, "wrong", Duration::from_secs(60), &stop)
            .unwrap_err()
            .to_string();
        assert!(e.contains("wrong cluster token"), "{e}");
        assert_eq!(hub.refused_handshakes(), 1);
        let mut link = Link::connect(&ctx, &endpoint, Some("t")).unwrap();
        let heard = heartbeat_heard(&mut link, &mut hub, 100);
        assert!(heard.is_some(), "the second hub's handler does not answer");
    }
}
