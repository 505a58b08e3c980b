//! The wire protocol between learner, actors and benchworkers (DESIGN §9),
//! the same over `inproc://`, `ipc://` and `tcp://`.
//!
//! A frame is a fixed prefix — magic `EMBS`, protocol version (u16, little
//! endian), message kind (u8) — followed by a bincode 2 body: the
//! [`Header`] (sender id, incarnation, sequence number, policy version) and
//! the [`Message`]. [`decode`] checks everything it can before trusting a
//! byte: the frame size against [`MAX_FRAME_BYTES`], the magic, the
//! version, that the kind in the prefix is the kind of the decoded message,
//! and bincode's own allocation limit. A frame that fails any check is a
//! [`DecodeError`] for the receiver to count and drop, never a panic.
//!
//! Payloads are plain data (no tensors): the actor and learner crates
//! convert to and from their tensor types and validate shapes on receipt.

use serde::{Deserialize, Serialize};

use common::{Measurement, Task};

/// The networks' parameters and an actor's unroll travel as the plain
/// data of `common`.
pub use common::payload::{NamedArray, UnrollData, Weights};

/// First bytes of every frame.
pub const MAGIC: [u8; 4] = *b"EMBS";
/// Bumped on any incompatible change of the messages below.
pub const PROTOCOL_VERSION: u16 = 4;
/// The largest frame a peer accepts (weights of the default networks are
/// about 200 KiB; a welcome carries the rollout tasks).
pub const MAX_FRAME_BYTES: usize = 64 << 20;
const PREFIX: usize = 7;

fn bincode_config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_FRAME_BYTES>()
}

/// Who a peer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    Actor,
    Benchworker,
    /// A rank other than 0 of a multi-host `cuda` benchworker group: it
    /// takes no jobs from the learner, only the group's NCCL unique id
    /// (rank 0 is a [`Role::Benchworker`] and measures for the group).
    GroupMember,
}

/// Every message's envelope besides the prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// The sender's id: the learner assigns it in [`Message::Welcome`]; 0
    /// before that and for the learner itself.
    pub sender: u64,
    /// Random per process start: tells a restarted peer from the old one.
    pub incarnation: u64,
    /// Per sender, increasing.
    pub seq: u64,
    /// The policy version the message is about (weights sent, weights an
    /// unroll was acted with); 0 where none applies.
    pub policy_version: u64,
}

/// Everything that travels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Message {
    /// A peer introduces itself; `token` must match the cluster's.
    Hello { role: Role, token: String },
    /// The learner accepts a peer: its id, the resolved configuration
    /// (TOML) and the tasks rollouts place (the training tasks, then their
    /// tight-memory and reshaped copies), which unrolls refer to by index.
    Welcome {
        peer: u64,
        config_toml: String,
        tasks: Vec<Task>,
    },
    /// The learner refuses a peer: for good (`retry` false: a wrong token),
    /// or until it says hello again (a learner restarted since its hello).
    Refused { reason: String, retry: bool },
    /// Both networks at a new policy version.
    Weights(Weights),
    /// An actor's rollouts, sent under a credit.
    Unroll(UnrollData),
    /// The learner allows an actor `n` more unrolls.
    Credit { n: u32 },
    /// Measure this plan of training task `task`: the device of each table.
    MeasureJob {
        job: u64,
        task: u32,
        assignment: Vec<u32>,
    },
    /// The result of a job.
    Measurement { job: u64, measurement: Measurement },
    /// A job that could not be measured, and why.
    JobFailed { job: u64, error: String },
    /// The learner made the job's measurement durable (fsynced into the
    /// cost log): it survives any crash from now on.
    Ack { job: u64 },
    /// Still alive.
    Heartbeat,
    /// Stop now.
    Shutdown,
    /// Rank 0 of a multi-host benchworker group posts its NCCL unique id;
    /// the learner hands it to the group's other ranks. `ranks[r]`: GPUs
    /// of rank `r`.
    NcclId {
        group: String,
        ranks: Vec<u32>,
        unique_id: Vec<u8>,
    },
    /// A group member asks for its group's unique id (answered with
    /// [`Message::NcclId`] as soon as rank 0 has posted one).
    NcclJoin { group: String },
    /// A benchworker, once it has set up its backend for the stay: the most
    /// devices a plan may have there (a `cuda` benchworker's GPUs, or its
    /// group's), `None` for any number. The learner sends wider plans to
    /// others.
    Ready { max_devices: Option<u32> },
}

/// Message kinds as they appear in the frame prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[repr(u8)]
pub enum Kind {
    Hello = 1,
    Welcome = 2,
    Refused = 3,
    Weights = 4,
    Unroll = 5,
    Credit = 6,
    MeasureJob = 7,
    Measurement = 8,
    JobFailed = 9,
    Heartbeat = 10,
    Shutdown = 11,
    Ack = 12,
    NcclId = 13,
    NcclJoin = 14,
    Ready = 15,
}

impl Message {
    pub fn kind(&self) -> Kind {
        match self {
            Message::Hello { .. } => Kind::Hello,
            Message::Welcome { .. } => Kind::Welcome,
            Message::Refused { .. } => Kind::Refused,
            Message::Weights(_) => Kind::Weights,
            Message::Unroll(_) => Kind::Unroll,
            Message::Credit { .. } => Kind::Credit,
            Message::MeasureJob { .. } => Kind::MeasureJob,
            Message::Measurement { .. } => Kind::Measurement,
            Message::JobFailed { .. } => Kind::JobFailed,
            Message::Heartbeat => Kind::Heartbeat,
            Message::Shutdown => Kind::Shutdown,
            Message::Ack { .. } => Kind::Ack,
            Message::NcclId { .. } => Kind::NcclId,
            Message::NcclJoin { .. } => Kind::NcclJoin,
            Message::Ready { .. } => Kind::Ready,
        }
    }
}

/// Why a frame was dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME_BYTES}")]
    Oversized(usize),
    #[error("frame of {0} bytes is shorter than its prefix")]
    Truncated(usize),
    #[error("bad magic: not an embshard frame")]
    BadMagic,
    #[error("protocol version {0}, expected {PROTOCOL_VERSION}")]
    WrongVersion(u16),
    #[error("undecodable body: {0}")]
    Body(String),
    #[error("prefix says kind {prefix}, body holds {body:?}")]
    KindMismatch { prefix: u8, body: Kind },
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
}

impl DecodeError {
    /// A short stable name, for counters.
    pub fn label(&self) -> &'static str {
        match self {
            DecodeError::Oversized(_) => "oversized",
            DecodeError::Truncated(_) => "truncated",
            DecodeError::BadMagic => "bad_magic",
            DecodeError::WrongVersion(_) => "wrong_version",
            DecodeError::Body(_) => "undecodable",
            DecodeError::KindMismatch { .. } => "kind_mismatch",
            DecodeError::Trailing(_) => "trailing_bytes",
        }
    }
}

/// Encodes one message into a frame.
pub fn encode(header: &Header, message: &Message) -> Vec<u8> {
    let mut frame = Vec::with_capacity(64);
    frame.extend_from_slice(&MAGIC);
    frame.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    frame.push(message.kind() as u8);
    // Serializing plain data into a Vec cannot fail short of the limit,
    // which only bounds what a receiver accepts.
    let body = bincode::serde::encode_to_vec((header, message), bincode::config::standard())
        .expect("plain data always serializes");
    frame.extend_from_slice(&body);
    frame
}

/// Decodes a frame, checking size, magic, version and kind.
pub fn decode(frame: &[u8]) -> Result<(Header, Message), DecodeError> {
    if frame.len() > MAX_FRAME_BYTES {
        return Err(DecodeError::Oversized(frame.len()));
    }
    if frame.len() < PREFIX {
        return Err(DecodeError::Truncated(frame.len()));
    }
    if frame[..4] != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let version = u16::from_le_bytes([frame[4], frame[5]]);
    if version != PROTOCOL_VERSION {
        return Err(DecodeError::WrongVersion(version));
    }
    let prefix = frame[6];
    let ((header, message), used): ((Header, Message), usize) =
        bincode::serde::decode_from_slice(&frame[PREFIX..], bincode_config())
            .map_err(|e| DecodeError::Body(e.to_string()))?;
    if used != frame.len() - PREFIX {
        return Err(DecodeError::Trailing(frame.len() - PREFIX - used));
    }
    if message.kind() as u8 != prefix {
        return Err(DecodeError::KindMismatch {
            prefix,
            body: message.kind(),
        });
    }
    Ok((header, message))
}

/// Counts of dropped frames by reason, and of refused peers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DropCounts {
    pub by_reason: std::collections::BTreeMap<String, u64>,
}

impl DropCounts {
    pub fn add(&mut self, reason: &str) {
        *self.by_reason.entry(reason.to_string()).or_default() += 1;
    }

    pub fn total(&self) -> u64 {
        self.by_reason.values().sum()
    }
}

/// A random 64-bit incarnation for this process start.
pub fn new_incarnation() -> u64 {
    rand::random::<u64>() | 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::{DeviceCost, Table};
    use proptest::prelude::*;

    fn header() -> Header {
        Header {
            sender: 7,
            incarnation: 0xdead_beef,
            seq: 42,
            policy_version: 3,
        }
    }

    fn every_kind() -> Vec<Message> {
        let table = Table::cold("t0", 1000, 64, 2.5);
        vec![
            Message::Hello {
                role: Role::Actor,
                token: "secret".into(),
            },
            Message::Welcome {
                peer: 3,
                config_toml: "[train]\niterations = 2\n".into(),
                tasks: vec![Task {
                    name: "task0".into(),
                    devices: 2,
                    memory_gb: 4.0,
                    tables: vec![table],
                }],
            },
            Message::Refused {
                reason: "wrong token".into(),
                retry: false,
            },
            Message::Weights(Weights {
                version: 9,
                policy: vec![NamedArray {
                    name: "policy.l1.weight".into(),
                    shape: vec![2, 2],
                    values: vec![1.0, -2.0, 3.5, f32::MIN_POSITIVE],
                }],
                cost: vec![],
            }),
            Message::Unroll(UnrollData {
                task: 1,
                episodes: 2,
                order: vec![1, 0],
                actions: vec![0, 1, 1, 1],
                behaviour_logp: vec![-0.5, -0.25, -1.0, -0.1],
                masks: vec![true; 8],
                device_features: vec![0.5; 24],
                predicted_cost_ms: vec![3.0, 4.0],
                reward_scale: 1.5,
                infeasible: vec![false, true],
            }),
            Message::Credit { n: 2 },
            Message::MeasureJob {
                job: 11,
                task: 4,
                assignment: vec![0, 1, 1],
            },
            Message::Measurement {
                job: 11,
                measurement: Measurement::from_devices(vec![DeviceCost::new(1.0, 2.0, 0.5, 0.25)]),
            },
            Message::JobFailed {
                job: 12,
                error: "plan names device 9".into(),
            },
            Message::Heartbeat,
            Message::Shutdown,
            Message::Ack { job: 11 },
            Message::NcclId {
                group: "rack-a".into(),
                ranks: vec![8, 8],
                unique_id: (0..128).collect(),
            },
            Message::NcclJoin {
                group: "rack-a".into(),
            },
            Message::Ready {
                max_devices: Some(8),
            },
        ]
    }

    #[test]
    fn every_kind_round_trips() {
        let all = every_kind();
        let kinds: std::collections::BTreeSet<Kind> = all.iter().map(Message::kind).collect();
        assert_eq!(kinds.len(), 15, "one message of each kind");
        for m in all {
            let frame = encode(&header(), &m);
            assert_eq!(frame[6], m.kind() as u8);
            assert_eq!(decode(&frame), Ok((header(), m)));
        }
    }

    #[test]
    fn bad_frames_are_errors_with_their_reason() {
        let frame = encode(&header(), &Message::Credit { n: 5 });
        assert_eq!(decode(&frame[..3]), Err(DecodeError::Truncated(3)));
        let mut bad = frame.clone();
        bad[0] = b'X';
        assert_eq!(decode(&bad), Err(DecodeError::BadMagic));
        let mut bad = frame.clone();
        bad[4..6].copy_from_slice(&(PROTOCOL_VERSION + 1).to_le_bytes());
        assert_eq!(
            decode(&bad),
            Err(DecodeError::WrongVersion(PROTOCOL_VERSION + 1))
        );
        let mut bad = frame.clone();
        bad[6] = Kind::Shutdown as u8;
        assert!(matches!(
            decode(&bad),
            Err(DecodeError::KindMismatch {
                body: Kind::Credit,
                ..
            })
        ));
        let mut bad = frame.clone();
        bad.push(0);
        assert_eq!(decode(&bad), Err(DecodeError::Trailing(1)));
        // A body cut short.
        let long = encode(&header(), &every_kind()[4]);
        assert!(matches!(
            decode(&long[..long.len() - 5]),
            Err(DecodeError::Body(_))
        ));
        let huge = vec![0u8; MAX_FRAME_BYTES + 1];
        assert_eq!(
            decode(&huge),
            Err(DecodeError::Oversized(MAX_FRAME_BYTES + 1))
        );
    }

    #[test]
    fn a_length_claiming_more_than_the_limit_is_refused_without_allocating() {
        // A weights message written byte by byte: one policy array whose
        // value count is `count` (a bincode varint), then `values`.
        let frame = |count: &[u8], values: &[u8]| {
            let mut f = MAGIC.to_vec();
            f.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
            f.push(Kind::Weights as u8);
            f.extend(bincode::serde::encode_to_vec(header(), bincode::config::standard()).unwrap());
            f.extend_from_slice(&[3, 9, 1, 0, 0]); // Weights, version 9, one array, no name, no shape
            f.extend_from_slice(count);
            f.extend_from_slice(values);
            f.push(0); // no cost arrays
            f
        };
        // The hand-written layout is right: one value decodes.
        let (_, m) = decode(&frame(&[1], &2.5f32.to_le_bytes())).unwrap();
        assert!(matches!(m, Message::Weights(w) if w.version == 9 && w.policy[0].values == [2.5]));
        // 2^40 values are refused before any allocation.
        let huge = frame(&[253, 0, 0, 0, 0, 0, 1, 0, 0], &[]);
        assert!(matches!(decode(&huge), Err(DecodeError::Body(_))));
    }

    proptest! {
        /// The decoder never panics, whatever arrives.
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&bytes);
        }

        /// Valid frames with random bytes flipped never panic either, and
        /// an untouched prefix with a flipped body is still checked.
        #[test]
        fn corrupted_frames_never_panic(which in 0usize..14, flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
            let mut frame = encode(&header(), &every_kind()[which]);
            for (at, byte) in flips {
                let n = frame.len();
                frame[at % n] ^= byte | 1;
            }
            let _ = decode(&frame);
        }
    }
}
