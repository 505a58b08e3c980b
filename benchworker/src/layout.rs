//! Where a plan's data lives on its devices and what the all-to-all moves,
//! for the backends that run real kernels. Plain arithmetic, no libtorch and
//! no GPU, so it is tested on any machine and shared by `cpu` and `cuda`.
//!
//! Model-parallel DLRM (DESIGN §6): device `d` holds its tables' rows,
//! concatenated into one fused weight, and looks up the whole batch `B` for
//! each of them; the data-parallel part owns `B/D` samples per device. So:
//!
//! - device `d`'s pooled output, sample-major as FBGEMM's table-batched
//!   kernel writes it, is `[B, S_d]` with `S_d` the sum of its tables' dims;
//!   the rows of device `e`'s samples form one contiguous chunk of it;
//! - in the forward all-to-all, `d` sends `e` that chunk, `c_e · S_d`
//!   elements, and `e` stacks what it receives by source device:
//!   `[c_e, S_0] ‖ [c_e, S_1] ‖ …`, `c_e · Σ S` elements;
//! - the backward all-to-all is the same exchange reversed: `e` sends `d`
//!   the gradient block of `d`'s tables, which lands in `d`'s `[B, S_d]`
//!   gradient at the rows of `e`'s samples.
//!
//! Every transfer is a contiguous range on both sides, which is what NCCL's
//! grouped `ncclSend`/`ncclRecv` need.

use common::{Plan, Table};

use crate::indices;

/// Which samples each device owns for the data-parallel part, as
/// `(first, count)`: `batch` split as evenly as possible, the first
/// `batch % devices` devices taking one more.
pub fn sample_split(batch: u64, devices: usize) -> Vec<(u64, u64)> {
    let d = devices as u64;
    let mut first = 0;
    (0..d)
        .map(|e| {
            let count = batch / d + u64::from(e < batch % d);
            let s = (first, count);
            first += count;
            s
        })
        .collect()
}

/// Elements of pooled output device `d` sends device `e` in the forward
/// all-to-all (and gathers back from it in the backward one):
/// `sent[d][e] = samples of e × Σ dims on d`.
pub fn exchange_elements(batch: u64, dim_sums: &[u64]) -> Vec<Vec<u64>> {
    let split = sample_split(batch, dim_sums.len());
    dim_sums
        .iter()
        .map(|&dims| split.iter().map(|&(_, n)| n * dims).collect())
        .collect()
}

/// One device's share of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceLayout {
    /// Task indices of its tables, in fused order.
    pub tables: Vec<usize>,
    pub dims: Vec<u64>,
    /// Rows of each table (capped): what its fused weight holds of it.
    pub rows: Vec<u64>,
    /// First column of each table in the device's `[B, S_d]` output.
    pub first_col: Vec<u64>,
    /// `S_d`: the sum of its tables' dims.
    pub dim_sum: u64,
}

impl DeviceLayout {
    pub fn total_rows(&self) -> u64 {
        self.rows.iter().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// The device's tables grouped by dim, groups in the order their first
    /// table comes: each group is one fused weight `[Σ rows, dim]` and one
    /// `embedding_bag` call.
    pub fn dim_groups(&self) -> Vec<DimGroup> {
        let mut groups: Vec<DimGroup> = Vec::new();
        for (i, &dim) in self.dims.iter().enumerate() {
            match groups.iter_mut().find(|g| g.dim == dim) {
                Some(g) => g.members.push(i),
                None => groups.push(DimGroup {
                    dim,
                    members: vec![i],
                }),
            }
        }
        groups
    }

    /// For each column of the `[B, S_d]` output (tables in device order),
    /// its column in the groups' outputs side by side: group after group of
    /// [`DeviceLayout::dim_groups`], each `[B, T_g · dim_g]` with its tables
    /// in order. One gather with it packs the groups' outputs into the
    /// exchanged layout; the inverse scatter unpacks the gradient.
    pub fn grouped_columns(&self) -> Vec<i64> {
        let mut start = vec![0u64; self.dims.len()];
        let mut next = 0;
        for g in self.dim_groups() {
            for &i in &g.members {
                start[i] = next;
                next += g.dim;
            }
        }
        let mut cols = Vec::with_capacity(self.dim_sum as usize);
        for (i, &dim) in self.dims.iter().enumerate() {
            cols.extend((start[i]..start[i] + dim).map(|c| c as i64));
        }
        cols
    }
}

/// A device's tables of one dim (positions among the device's tables).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DimGroup {
    pub dim: u64,
    pub members: Vec<usize>,
}

/// One contiguous transfer of the all-to-all, in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    pub from: usize,
    pub to: usize,
    /// Start in the sender's buffer.
    pub send_offset: u64,
    /// Start in the receiver's buffer.
    pub recv_offset: u64,
    pub count: u64,
}

/// A plan laid out on its devices for a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanLayout {
    pub batch: u64,
    pub devices: Vec<DeviceLayout>,
    /// `(first, count)` of each device's samples.
    pub split: Vec<(u64, u64)>,
}

impl PlanLayout {
    /// `row_cap`: rows of a table beyond it are not materialised (0: no cap).
    pub fn new(tables: &[Table], plan: &Plan, batch: u64, row_cap: u64) -> Self {
        let cap = if row_cap == 0 { u64::MAX } else { row_cap };
        let devices = plan
            .groups()
            .iter()
            .map(|group| {
                let dims: Vec<u64> = group.iter().map(|&t| u64::from(tables[t].dim)).collect();
                let rows: Vec<u64> = group
                    .iter()
                    .map(|&t| indices::capped_rows(&tables[t], cap))
                    .collect();
                DeviceLayout {
                    tables: group.clone(),
                    first_col: prefix_sums(&dims),
                    dim_sum: dims.iter().sum(),
                    dims,
                    rows,
                }
            })
            .collect();
        PlanLayout {
            batch,
            devices,
            split: sample_split(batch, plan.devices),
        }
    }

    /// `Σ_d S_d`: the width of the data-parallel side.
    pub fn total_dims(&self) -> u64 {
        self.devices.iter().map(|d| d.dim_sum).sum()
    }

    /// Elements of device `d`'s pooled output (and of its output gradient).
    pub fn output_len(&self, d: usize) -> u64 {
        self.batch * self.devices[d].dim_sum
    }

    /// Elements device `e` receives in the forward all-to-all (and sends
    /// back in the backward one): its samples of every table.
    pub fn exchanged_len(&self, e: usize) -> u64 {
        self.split[e].1 * self.total_dims()
    }

    /// The forward all-to-all: from each device's `[B, S_d]` output to each
    /// device's `[c_e, S_0] ‖ [c_e, S_1] ‖ …` buffer. Transfers of no
    /// elements are left out (NCCL needs both sides to agree, and they do).
    pub fn forward_transfers(&self) -> Vec<Transfer> {
        let before: Vec<u64> =
            prefix_sums(&self.devices.iter().map(|d| d.dim_sum).collect::<Vec<_>>());
        let mut out = Vec::new();
        for (d, dev) in self.devices.iter().enumerate() {
            for (e, &(first, count)) in self.split.iter().enumerate() {
                let n = count * dev.dim_sum;
                if n > 0 {
                    out.push(Transfer {
                        from: d,
                        to: e,
                        send_offset: first * dev.dim_sum,
                        recv_offset: count * before[d],
                        count: n,
                    });
                }
            }
        }
        out
    }

    /// The backward all-to-all: every forward transfer reversed.
    pub fn backward_transfers(&self) -> Vec<Transfer> {
        self.forward_transfers()
            .into_iter()
            .map(|t| Transfer {
                from: t.to,
                to: t.from,
                send_offset: t.recv_offset,
                recv_offset: t.send_offset,
                count: t.count,
            })
            .collect()
    }
}

/// Exclusive prefix sums: where each of `xs` starts, `[0, a, a + b, …]`
/// (as many as `xs`).
pub(crate) fn prefix_sums<T>(xs: &[T]) -> Vec<T>
where
    T: Copy + Default + std::ops::AddAssign,
{
    let mut acc = T::default();
    xs.iter()
        .map(|&x| {
            let s = acc;
            acc += x;
            s
        })
        .collect()
}

/// Plan devices spread over the processes of a multi-host group: rank `r`
/// drives `devices[r]` GPUs, and the plan's devices are numbered rank after
/// rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranks {
    pub devices: Vec<usize>,
}

impl Ranks {
    pub fn total(&self) -> usize {
        self.devices.iter().sum()
    }

    /// The plan devices rank `r` drives.
    pub fn local(&self, r: usize) -> std::ops::Range<usize> {
        let first: usize = self.devices[..r].iter().sum();
        first..first + self.devices[r]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn table(name: &str, rows: u64, dim: u32) -> Table {
        crate::test_table(name, rows, dim, 2.0, &[(0, 1.0)])
    }

    fn tables(dims: &[u32]) -> Vec<Table> {
        dims.iter()
            .enumerate()
            .map(|(i, &d)| table(&format!("t{i}"), 100 + i as u64, d))
            .collect()
    }

    #[test]
    fn samples_split_evenly_and_completely() {
        assert_eq!(sample_split(10, 3), vec![(0, 4), (4, 3), (7, 3)]);
        assert_eq!(sample_split(8, 4), vec![(0, 2), (2, 2), (4, 2), (6, 2)]);
        assert_eq!(sample_split(2, 3), vec![(0, 1), (1, 1), (2, 0)]);
    }

    #[test]
    fn exchange_volume_is_peer_samples_times_local_dims() {
        let sent = exchange_elements(10, &[16 + 64, 0, 32]);
        assert_eq!(sent[0], vec![4 * 80, 3 * 80, 3 * 80]);
        assert_eq!(sent[1], vec![0, 0, 0]);
        assert_eq!(sent[2], vec![4 * 32, 3 * 32, 3 * 32]);
    }

    #[test]
    fn devices_hold_their_tables_fused_with_row_and_column_offsets() {
        let t = tables(&[16, 64, 32, 8]);
        let plan = Plan {
            devices: 3,
            assignment: vec![0, 2, 0, 0],
        };
        let l = PlanLayout::new(&t, &plan, 10, 101);
        let d0 = &l.devices[0];
        assert_eq!(d0.tables, vec![0, 2, 3]);
        assert_eq!(d0.rows, vec![100, 101, 101]); // capped at 101
        assert_eq!(d0.first_col, vec![0, 16, 48]);
        assert_eq!((d0.dim_sum, d0.total_rows()), (56, 302));
        assert!(l.devices[1].is_empty());
        assert_eq!(l.devices[1].dim_sum, 0);
        assert_eq!(l.devices[2].tables, vec![1]);
        assert_eq!(l.total_dims(), 120);
        // No cap: the tables' own rows.
        let l = PlanLayout::new(&t, &plan, 10, 0);
        assert_eq!(l.devices[0].rows, vec![100, 102, 103]);
    }

    #[test]
    fn tables_of_one_dim_are_grouped_and_their_columns_found() {
        let t = tables(&[4, 2, 4, 3]);
        let plan = Plan {
            devices: 1,
            assignment: vec![0, 0, 0, 0],
        };
        let l = PlanLayout::new(&t, &plan, 4, 0);
        let d = &l.devices[0];
        let groups = d.dim_groups();
        let shape: Vec<(u64, Vec<usize>)> =
            groups.into_iter().map(|g| (g.dim, g.members)).collect();
        assert_eq!(shape, [(4, vec![0, 2]), (2, vec![1]), (3, vec![3])]);
        // Side by side: tables 0 and 2 (dim 4), then 1 (dim 2), then 3.
        assert_eq!(
            d.grouped_columns(),
            [0, 1, 2, 3, 8, 9, 4, 5, 6, 7, 10, 11, 12]
        );
        // One dim: the columns stay where they are.
        let same = PlanLayout::new(
            &tables(&[8, 8]),
            &Plan {
                devices: 1,
                assignment: vec![0, 0],
            },
            4,
            0,
        );
        let cols = same.devices[0].grouped_columns();
        assert_eq!(cols, (0..16).collect::<Vec<i64>>());
    }

    /// Where task table `t`'s output for global sample `b`, column `c`, lies
    /// after the forward all-to-all: `(device, offset)` in that device's
    /// exchanged buffer: the reference the exchange is tested against.
    fn exchanged_position(l: &PlanLayout, t: usize, b: u64, c: u64) -> Option<(usize, u64)> {
        let (d, i) = l
            .devices
            .iter()
            .enumerate()
            .find_map(|(d, dev)| dev.tables.iter().position(|&x| x == t).map(|i| (d, i)))?;
        let e = l.split.iter().position(|&(f, n)| b >= f && b < f + n)?;
        let (first, count) = l.split[e];
        let before: u64 = l.devices[..d].iter().map(|x| x.dim_sum).sum();
        let dev = &l.devices[d];
        Some((
            e,
            count * before + (b - first) * dev.dim_sum + dev.first_col[i] + c,
        ))
    }

    /// Runs an exchange on plain buffers, as NCCL would on device memory.
    fn run(transfers: &[Transfer], send: &[Vec<f64>], recv: &mut [Vec<f64>]) {
        for t in transfers {
            let (s, r) = (t.send_offset as usize, t.recv_offset as usize);
            let n = t.count as usize;
            recv[t.to][r..r + n].copy_from_slice(&send[t.from][s..s + n]);
        }
    }

    /// The value of table `t`'s output for sample `b`, column `c`.
    fn value(t: usize, b: u64, c: u64) -> f64 {
        (t * 1_000_000) as f64 + (b * 1000) as f64 + c as f64
    }

    fn check_exchange(dims: &[u32], assignment: Vec<usize>, devices: usize, batch: u64) {
        let t = tables(dims);
        let plan = Plan {
            devices,
            assignment,
        };
        let l = PlanLayout::new(&t, &plan, batch, 0);
        // Each device's [B, S_d] output, sample-major.
        let outputs: Vec<Vec<f64>> = l
            .devices
            .iter()
            .map(|dev| {
                let mut v = Vec::new();
                for b in 0..batch {
                    for (&tab, &dim) in dev.tables.iter().zip(&dev.dims) {
                        v.extend((0..dim).map(|c| value(tab, b, c)));
                    }
                }
                v
            })
            .collect();
        for (d, o) in outputs.iter().enumerate() {
            assert_eq!(o.len() as u64, l.output_len(d));
        }
        let mut recv: Vec<Vec<f64>> = (0..devices)
            .map(|e| vec![f64::NAN; l.exchanged_len(e) as usize])
            .collect();
        let fwd = l.forward_transfers();
        run(&fwd, &outputs, &mut recv);
        // Every sample of every table reached its owner, where expected.
        for (tab, tt) in t.iter().enumerate() {
            for b in 0..batch {
                for c in 0..u64::from(tt.dim) {
                    let (e, off) = exchanged_position(&l, tab, b, c).unwrap();
                    assert_eq!(recv[e][off as usize], value(tab, b, c));
                }
            }
        }
        assert!(recv.iter().flatten().all(|x| !x.is_nan()), "a gap");
        // The backward returns every element to where it came from.
        let mut back: Vec<Vec<f64>> = (0..devices)
            .map(|d| vec![f64::NAN; l.output_len(d) as usize])
            .collect();
        run(&l.backward_transfers(), &recv, &mut back);
        assert_eq!(back, outputs);
        // Both sides of each pair agree on the size.
        let sent = exchange_elements(
            batch,
            &l.devices.iter().map(|d| d.dim_sum).collect::<Vec<_>>(),
        );
        for t in &fwd {
            assert_eq!(t.count, sent[t.from][t.to]);
        }
    }

    #[test]
    fn the_exchange_delivers_every_sample_of_every_table_and_back() {
        // Uneven dims, an empty device, a batch that does not divide.
        check_exchange(&[16, 64, 32, 8, 128], vec![0, 2, 0, 3, 2], 4, 11);
        // More devices than samples.
        check_exchange(&[4, 8], vec![1, 0], 3, 2);
        check_exchange(&[4], vec![0], 1, 5);
    }

    proptest! {
        #[test]
        fn any_plan_exchanges_without_gaps_or_overlaps(
            (devices, assignment, dims) in (1usize..6).prop_flat_map(|d| (
                Just(d),
                proptest::collection::vec(0..d, 1..9),
                proptest::collection::vec(1u32..20, 9),
            )),
            batch in 1u64..23,
        ) {
            let dims = &dims[..assignment.len()];
            check_exchange(dims, assignment, devices, batch);
        }
    }

    #[test]
    fn ranks_number_devices_rank_after_rank() {
        let r = Ranks {
            devices: vec![2, 3, 1],
        };
        assert_eq!(r.total(), 6);
        assert_eq!(r.local(1), 2..5);
    }
}
