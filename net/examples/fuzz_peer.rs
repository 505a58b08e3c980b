//! A hostile peer of the learner, for `scripts/fuzz.py`: it opens idle
//! connections, sends crafted frames with the cluster token, or floods the
//! learner with garbage frames, each bounded in count and time, and prints
//! what it did as one JSON line.
//!
//! ```sh
//! cargo run --release -p embshard-net --example fuzz_peer -- connect tcp://127.0.0.1:5555 --count 2000
//! cargo run --release -p embshard-net --example fuzz_peer -- crafted tcp://127.0.0.1:5555 --token-file RUN/token
//! cargo run --release -p embshard-net --example fuzz_peer -- garbage tcp://127.0.0.1:5555 --token-file RUN/token
//! ```

use std::io::{Read as _, Write as _};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use common::{DeviceCost, Measurement};
use net::protocol::{encode, Header, Message, NamedArray, Role, UnrollData, Weights};
use rand::{rngs::StdRng, Rng, SeedableRng};

#[derive(Parser)]
#[command(about = "A hostile peer of the learner (for scripts/fuzz.py)")]
struct Cli {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
enum What {
    /// Opens plain TCP connections that never finish a ZeroMQ handshake
    /// (half of them send random bytes), holds them, and reports how many
    /// the learner closed and when.
    Connect {
        /// `tcp://HOST:PORT`.
        endpoint: String,
        #[arg(long, default_value_t = 2000)]
        count: usize,
        /// Seconds to hold them.
        #[arg(long, default_value_t = 8.0)]
        hold_s: f64,
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Sends frames crafted from valid messages of every kind, mutated
    /// (bits flipped, cut, lengthened, another prefix or kind, extra parts,
    /// other senders), over connections that hold the cluster token.
    Crafted {
        endpoint: String,
        #[arg(long)]
        token_file: std::path::PathBuf,
        /// The most frames to send.
        #[arg(long, default_value_t = 200_000)]
        frames: u64,
        /// The most seconds to send for.
        #[arg(long, default_value_t = 60.0)]
        seconds: f64,
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Sends short random frames as fast as the socket takes them, with the
    /// cluster token.
    Garbage {
        endpoint: String,
        #[arg(long)]
        token_file: std::path::PathBuf,
        #[arg(long, default_value_t = 60.0)]
        seconds: f64,
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().what {
        What::Connect {
            endpoint,
            count,
            hold_s,
            seed,
        } => connect(&endpoint, count, hold_s, seed),
        What::Crafted {
            endpoint,
            token_file,
            frames,
            seconds,
            seed,
        } => crafted(&endpoint, &token(&token_file)?, frames, seconds, seed),
        What::Garbage {
            endpoint,
            token_file,
            seconds,
            seed,
        } => garbage(&endpoint, &token(&token_file)?, seconds, seed),
    }
}

fn token(file: &std::path::Path) -> anyhow::Result<String> {
    net::link::read_token(Some(file))?
        .ok_or_else(|| anyhow::anyhow!("no token in {}", file.display()))
}

/// A DEALER socket connected to `endpoint` with the cluster token.
fn peer(ctx: &zmq::Context, endpoint: &str, token: &str) -> anyhow::Result<zmq::Socket> {
    let s = ctx.socket(zmq::DEALER)?;
    s.set_linger(0)?;
    s.set_sndhwm(10_000)?;
    s.set_plain_username(Some("embshard"))?;
    s.set_plain_password(Some(token))?;
    s.connect(endpoint)?;
    Ok(s)
}

fn connect(endpoint: &str, count: usize, hold_s: f64, seed: u64) -> anyhow::Result<()> {
    let addr = endpoint
        .strip_prefix("tcp://")
        .ok_or_else(|| anyhow::anyhow!("{endpoint}: a tcp:// endpoint"))?;
    let mut rng = StdRng::seed_from_u64(seed);
    let start = Instant::now();
    let mut streams = Vec::with_capacity(count);
    let mut failed = 0;
    let mut buf = [0u8; 4096];
    // Which streams the learner has ended, and when (seconds from start).
    let mut watch = |streams: &mut Vec<(std::net::TcpStream, f64, Option<f64>)>| {
        for (s, _, closed) in streams.iter_mut().filter(|(_, _, c)| c.is_none()) {
            loop {
                match s.read(&mut buf) {
                    Ok(0) => *closed = Some(start.elapsed().as_secs_f64()),
                    Ok(_) => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => *closed = Some(start.elapsed().as_secs_f64()),
                }
                break;
            }
        }
    };
    for k in 0..count {
        match std::net::TcpStream::connect(addr) {
            Ok(mut s) => {
                if k % 2 == 1 {
                    let junk: Vec<u8> = (0..rng.gen_range(1..64)).map(|_| rng.gen()).collect();
                    let _ = s.write_all(&junk);
                }
                s.set_nonblocking(true)?;
                streams.push((s, start.elapsed().as_secs_f64(), None::<f64>));
            }
            Err(_) => failed += 1,
        }
        if k % 50 == 49 {
            watch(&mut streams);
        }
    }
    let opened_s = start.elapsed().as_secs_f64();
    // Then until the hold is over, counted from the last one opened.
    while start.elapsed().as_secs_f64() < opened_s + hold_s {
        watch(&mut streams);
        std::thread::sleep(Duration::from_millis(50));
    }
    // How long each closed one lived.
    let mut closed: Vec<f64> = streams
        .iter()
        .filter_map(|(_, opened, c)| c.map(|c| c - opened))
        .collect();
    closed.sort_by(f64::total_cmp);
    let median = closed.get(closed.len() / 2).copied();
    println!(
        "{}",
        serde_json::json!({
            "mode": "connect",
            "opened": streams.len(),
            "failed_to_open": failed,
            "opened_in_s": opened_s,
            "closed_by_learner": closed.len(),
            "lived_median_s": median,
            "lived_max_s": closed.last(),
            "held_s": hold_s,
        })
    );
    Ok(())
}

/// A valid message of every kind, with random contents.
fn message(rng: &mut StdRng, token: &str) -> Message {
    let floats = |rng: &mut StdRng, n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| match rng.gen_range(0..8) {
                0 => f32::NAN,
                1 => f32::INFINITY,
                2 => -1e30,
                _ => rng.gen_range(-10.0..10.0),
            })
            .collect()
    };
    let n = rng.gen_range(0..40);
    let small = |rng: &mut StdRng| -> u32 {
        match rng.gen_range(0..4) {
            0 => u32::MAX,
            1 => rng.gen(),
            _ => rng.gen_range(0..16),
        }
    };
    match rng.gen_range(0..15) {
        0 => Message::Hello {
            role: [Role::Actor, Role::Benchworker, Role::GroupMember][rng.gen_range(0..3)],
            token: if rng.gen_bool(0.5) {
                token.to_string()
            } else {
                "not the token".into()
            },
        },
        1 => Message::Welcome {
            peer: rng.gen(),
            config_toml: "[train]\niterations = 1".into(),
            tasks: vec![],
        },
        2 => Message::Refused {
            reason: "no".into(),
            retry: rng.gen(),
        },
        3 => Message::Weights(Weights {
            version: rng.gen(),
            policy: vec![NamedArray {
                name: "policy.w".into(),
                shape: vec![rng.gen_range(-1..8), rng.gen_range(-1..8)],
                values: floats(rng, n),
            }],
            cost: vec![],
        }),
        4 => {
            let e = rng.gen_range(0..4);
            Message::Unroll(UnrollData {
                task: small(rng),
                episodes: e,
                order: (0..n).map(|_| small(rng)).collect(),
                actions: (0..n).map(|_| small(rng)).collect(),
                behaviour_logp: floats(rng, n),
                masks: (0..n).map(|_| rng.gen()).collect(),
                device_features: floats(rng, n * 3),
                predicted_cost_ms: floats(rng, e as usize),
                reward_scale: rng.gen_range(-1.0..2.0),
                infeasible: (0..e).map(|_| rng.gen()).collect(),
            })
        }
        5 => Message::Credit { n: small(rng) },
        6 => Message::MeasureJob {
            job: rng.gen(),
            task: small(rng),
            assignment: (0..n).map(|_| small(rng)).collect(),
        },
        7 => {
            let devices = (0..rng.gen_range(0..6))
                .map(|_| {
                    let f = |rng: &mut StdRng| f64::from(floats(rng, 1)[0]);
                    let (fwd_ms, bwd_ms, fwd_comm_ms, bwd_comm_ms) =
                        (f(rng), f(rng), f(rng), f(rng));
                    DeviceCost {
                        fwd_ms,
                        bwd_ms,
                        fwd_comm_ms,
                        bwd_comm_ms,
                        total_ms: fwd_ms + bwd_ms + fwd_comm_ms + bwd_comm_ms,
                    }
                })
                .collect();
            Message::Measurement {
                job: rng.gen_range(0..64),
                measurement: Measurement::from_devices(devices),
            }
        }
        8 => Message::JobFailed {
            job: rng.gen_range(0..64),
            error: "x".repeat(rng.gen_range(0..2000)),
        },
        9 => Message::Ack { job: rng.gen() },
        10 => Message::Heartbeat,
        11 => Message::Shutdown,
        12 => Message::NcclId {
            group: "g".into(),
            ranks: (0..rng.gen_range(0..4)).map(|_| small(rng)).collect(),
            unique_id: (0..rng.gen_range(0..200)).map(|_| rng.gen()).collect(),
        },
        13 => Message::NcclJoin { group: "g".into() },
        _ => Message::Ready {
            max_devices: rng.gen::<bool>().then(|| small(rng)),
        },
    }
}

/// One frame (or several parts) crafted from a valid message.
fn craft(rng: &mut StdRng, token: &str, seq: &mut u64) -> Vec<Vec<u8>> {
    *seq += 1;
    let header = Header {
        sender: match rng.gen_range(0..4) {
            0 => 0,
            1 => rng.gen(),
            _ => rng.gen_range(1..8),
        },
        incarnation: rng.gen_range(0..3),
        seq: if rng.gen_bool(0.9) { *seq } else { rng.gen() },
        policy_version: rng.gen_range(0..4),
    };
    let mut frame = encode(&header, &message(rng, token));
    match rng.gen_range(0..10) {
        // As encoded.
        0 | 1 => {}
        // Bits flipped.
        2 | 3 => {
            for _ in 0..rng.gen_range(1..8) {
                let i = rng.gen_range(0..frame.len());
                frame[i] ^= 1 << rng.gen_range(0..8);
            }
        }
        // Cut short.
        4 => frame.truncate(rng.gen_range(0..frame.len())),
        // Lengthened.
        5 => frame.extend((0..rng.gen_range(1..256)).map(|_| rng.gen::<u8>())),
        // Another magic, version or kind in the prefix.
        6 => {
            let i = rng.gen_range(0..7.min(frame.len()));
            frame[i] = rng.gen();
        }
        // Extra parts.
        7 => {
            let mut parts = vec![frame];
            for _ in 0..rng.gen_range(1..4) {
                parts.push((0..rng.gen_range(0..64)).map(|_| rng.gen()).collect());
            }
            return parts;
        }
        // Empty.
        8 => frame.clear(),
        // Large and random (up to 4 MiB).
        _ => {
            if rng.gen_ratio(1, 50) {
                frame = (0..rng.gen_range(1..4usize << 20))
                    .map(|_| rng.gen())
                    .collect();
            }
        }
    }
    vec![frame]
}

fn crafted(
    endpoint: &str,
    token: &str,
    frames: u64,
    seconds: f64,
    seed: u64,
) -> anyhow::Result<()> {
    let ctx = zmq::Context::new();
    let mut rng = StdRng::seed_from_u64(seed);
    let start = Instant::now();
    let (mut sent, mut parts, mut bytes, mut seq, mut peers, mut replies) = (0u64, 0, 0, 0, 0, 0);
    let mut socket = peer(&ctx, endpoint, token)?;
    while sent < frames && start.elapsed().as_secs_f64() < seconds {
        // Now and then a new connection: another peer.
        if rng.gen_ratio(1, 2000) {
            socket = peer(&ctx, endpoint, token)?;
            peers += 1;
        }
        let msg = craft(&mut rng, token, &mut seq);
        let n = msg.len();
        let size: usize = msg.iter().map(Vec::len).sum();
        match socket.send_multipart(msg, zmq::DONTWAIT) {
            Ok(()) => {
                sent += 1;
                parts += n;
                bytes += size;
            }
            Err(zmq::Error::EAGAIN) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => return Err(e.into()),
        }
        while socket.recv_multipart(zmq::DONTWAIT).is_ok() {
            replies += 1;
        }
    }
    // What is queued still goes before the socket closes.
    socket.set_linger(10_000)?;
    drop(socket);
    println!(
        "{}",
        serde_json::json!({
            "mode": "crafted",
            "frames": sent,
            "parts": parts,
            "bytes": bytes,
            "connections": peers + 1,
            "replies": replies,
            "seconds": start.elapsed().as_secs_f64(),
        })
    );
    Ok(())
}

fn garbage(endpoint: &str, token: &str, seconds: f64, seed: u64) -> anyhow::Result<()> {
    let ctx = zmq::Context::new();
    let socket = peer(&ctx, endpoint, token)?;
    let mut rng = StdRng::seed_from_u64(seed);
    let start = Instant::now();
    let (mut sent, mut bytes) = (0u64, 0u64);
    let mut frame = Vec::with_capacity(64);
    while start.elapsed().as_secs_f64() < seconds {
        for _ in 0..1000 {
            frame.clear();
            frame.extend((0..rng.gen_range(1..64)).map(|_| rng.gen::<u8>()));
            match socket.send(&frame, zmq::DONTWAIT) {
                Ok(()) => {
                    sent += 1;
                    bytes += frame.len() as u64;
                }
                Err(zmq::Error::EAGAIN) => {
                    std::thread::sleep(Duration::from_micros(200));
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
        while socket.recv_bytes(zmq::DONTWAIT).is_ok() {}
    }
    socket.set_linger(10_000)?;
    drop(socket);
    println!(
        "{}",
        serde_json::json!({
            "mode": "garbage",
            "frames": sent,
            "bytes": bytes,
            "seconds": start.elapsed().as_secs_f64(),
        })
    );
    Ok(())
}
