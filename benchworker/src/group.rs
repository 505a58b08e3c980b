//! What the processes of a multi-host `cuda` group tell each other over
//! NCCL, as plain bytes and numbers: tested without a GPU.
//!
//! Rank 0 (the leader, the only one the learner sends jobs to) broadcasts
//! each job to every rank as a fixed 8-byte header — the payload's length,
//! little endian, 0 meaning "stop" — then the payload, the job's tables and
//! plan as JSON. After the timed repeats, every device all-gathers its
//! phases, `repeats × 4` f64 per device in device order, so the leader can
//! assemble the measurement of the whole plan.

use common::{Plan, Table};
use serde::{Deserialize, Serialize};

use crate::timing::Phases;

/// Bytes of the broadcast header.
pub const HEADER_BYTES: usize = 8;

/// A job as the leader broadcasts it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupJob {
    pub tables: Vec<Table>,
    pub plan: Plan,
}

/// The header announcing a payload of `len` bytes (0: stop).
pub fn header(len: usize) -> [u8; HEADER_BYTES] {
    (len as u64).to_le_bytes()
}

/// A job header that announces no payload this process can take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadHeader {
    #[error("a job header of {0} bytes")]
    Length(usize),
    #[error("a job of {0} bytes")]
    TooLarge(u64),
}

/// The payload length a header announces; `None` for "stop".
pub fn payload_len(header: &[u8]) -> Result<Option<usize>, BadHeader> {
    let bytes: [u8; HEADER_BYTES] = header
        .try_into()
        .map_err(|_| BadHeader::Length(header.len()))?;
    match u64::from_le_bytes(bytes) {
        0 => Ok(None),
        n => usize::try_from(n)
            .map(Some)
            .map_err(|_| BadHeader::TooLarge(n)),
    }
}

pub fn encode_job(tables: &[Table], plan: &Plan) -> Vec<u8> {
    serde_json::to_vec(&GroupJob {
        tables: tables.to_vec(),
        plan: plan.clone(),
    })
    .expect("tables and plans serialise")
}

/// Why the phases gathered from a group do not make a measurement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GatherError {
    #[error("{got} gathered values for {world} devices × {repeats} repeats × 4 phases")]
    Count {
        got: usize,
        world: usize,
        repeats: usize,
    },
    #[error("a plan on {devices} devices in a group of {world}")]
    Devices { devices: usize, world: usize },
}

pub fn decode_job(bytes: &[u8]) -> Result<GroupJob, serde_json::Error> {
    serde_json::from_slice(bytes)
}

/// One device's contribution to the all-gather: its phases, repeat after
/// repeat.
pub fn flatten_phases(rounds: &[Phases]) -> Vec<f64> {
    rounds
        .iter()
        .flat_map(|p| [p.fwd, p.fwd_comm, p.bwd_comm, p.bwd])
        .collect()
}

/// The gathered phases of all `world` devices back as rounds of the plan's
/// first `devices` devices: `rounds[r][d]`.
pub fn gathered_rounds(
    gathered: &[f64],
    world: usize,
    repeats: usize,
    devices: usize,
) -> Result<Vec<Vec<Phases>>, GatherError> {
    if gathered.len() != world * repeats * 4 {
        return Err(GatherError::Count {
            got: gathered.len(),
            world,
            repeats,
        });
    }
    if devices > world {
        return Err(GatherError::Devices { devices, world });
    }
    Ok((0..repeats)
        .map(|r| {
            (0..devices)
                .map(|d| {
                    let at = (d * repeats + r) * 4;
                    let v = &gathered[at..at + 4];
                    Phases {
                        fwd: v[0],
                        fwd_comm: v[1],
                        bwd_comm: v[2],
                        bwd: v[3],
                    }
                })
                .collect()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_announce_lengths_and_zero_stops() {
        assert_eq!(payload_len(&header(1234)), Ok(Some(1234)));
        assert_eq!(payload_len(&header(0)), Ok(None));
        assert_eq!(payload_len(&[1, 2, 3]), Err(BadHeader::Length(3)));
    }

    #[test]
    fn a_job_survives_the_broadcast_encoding() {
        let tables = crate::test_pool(3, 5);
        let plan = Plan {
            devices: 2,
            assignment: vec![1, 0, 1],
        };
        let job = decode_job(&encode_job(&tables, &plan)).unwrap();
        assert_eq!(job.tables, tables);
        assert_eq!(job.plan, plan);
        assert!(decode_job(b"{\"tables\": 3}").is_err());
    }

    #[test]
    fn gathered_phases_come_back_per_round_and_device() {
        let phases = |d: usize, r: usize| Phases {
            fwd: (10 * d + r) as f64,
            fwd_comm: 0.5,
            bwd_comm: 0.25,
            bwd: (100 * d + r) as f64,
        };
        let (world, repeats) = (3, 2);
        let gathered: Vec<f64> = (0..world)
            .flat_map(|d| flatten_phases(&(0..repeats).map(|r| phases(d, r)).collect::<Vec<_>>()))
            .collect();
        let rounds = gathered_rounds(&gathered, world, repeats, 2).unwrap();
        assert_eq!(rounds.len(), repeats);
        for (r, round) in rounds.iter().enumerate() {
            assert_eq!(round.len(), 2);
            for (d, p) in round.iter().enumerate() {
                assert_eq!(*p, phases(d, r));
            }
        }
        assert!(matches!(
            gathered_rounds(&gathered[1..], world, repeats, 2),
            Err(GatherError::Count { .. })
        ));
        assert_eq!(
            gathered_rounds(&gathered, world, repeats, 4),
            Err(GatherError::Devices {
                devices: 4,
                world: 3
            })
        );
    }
}
