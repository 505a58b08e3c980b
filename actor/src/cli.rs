//! The `actor` command line.

use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use common::config::Config;

/// An embshard actor: rolls out placement episodes on CPU for the learner.
#[derive(Debug, Parser)]
#[command(name = "actor", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Roll out episodes for a training learner.
    ///
    /// Connects to the learner, says hello with the cluster token (from
    /// --token-file or EMBSHARD_TOKEN), takes the configuration, training
    /// tasks and newest weights from it, and sends one unroll per credit
    /// until the learner says stop or Ctrl-C. When the learner goes silent
    /// (a crash, a restart), it says hello again until one answers. Start
    /// as many as you like, at any time.
    ///
    /// Example:
    ///
    ///   actor run --learner tcp://127.0.0.1:5555 --token-file runs/x/token
    Run {
        /// The learner's endpoint (see its DIR/endpoint).
        #[arg(long)]
        learner: String,
        /// File holding the cluster token (or set EMBSHARD_TOKEN).
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// Seeds the task choice and the sampling of actions (default: random).
        #[arg(long)]
        seed: Option<u64>,
        /// Give up when no learner answers for this many seconds.
        #[arg(long, default_value_t = 600.0)]
        wait_s: f64,
    },
    /// Print the resolved configuration (defaults filled in, validated) as TOML.
    ///
    /// Example:
    ///
    ///   actor config --config configs/default.toml
    Config {
        /// Configuration TOML; defaults when omitted.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Time rollouts on the estimated MDP: placement steps per second, and
    /// the size of one unroll on the wire.
    ///
    /// Untrained networks of the configured sizes place a seeded DLRM-like
    /// task `--rounds` times, `--episodes` episodes in lockstep, on one
    /// libtorch thread. A benchmark, not a test: the figure depends on the
    /// machine.
    ///
    /// Example:
    ///
    ///   actor bench --tables 50 --devices 4 --episodes 256 --rounds 20
    Bench {
        #[arg(long, default_value_t = 50)]
        tables: usize,
        #[arg(long, default_value_t = 4)]
        devices: usize,
        #[arg(long, default_value_t = 256)]
        episodes: usize,
        #[arg(long, default_value_t = 20)]
        rounds: usize,
        /// Configuration TOML (its model and generate sections); defaults when omitted.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

pub fn run(cli: Cli, out: &mut dyn Write) -> anyhow::Result<()> {
    match cli.command {
        Command::Config { config } => {
            let cfg = Config::load(config.as_deref())?;
            write!(out, "{}", toml::to_string_pretty(&cfg)?)?;
            Ok(())
        }
        Command::Bench {
            tables,
            devices,
            episodes,
            rounds,
            config,
        } => bench(tables, devices, episodes, rounds, config, out),
        Command::Run {
            learner,
            token_file,
            seed,
            wait_s,
        } => {
            let wait = net::link::seconds("--wait-s", wait_s)?;
            let token = net::link::read_token(token_file.as_deref())?.ok_or_else(|| {
                anyhow::anyhow!(
                    "no cluster token: give --token-file or set {}",
                    net::link::TOKEN_ENV
                )
            })?;
            // One libtorch thread per actor: start more actors for more cores.
            tch::set_num_threads(1);
            let stop = net::link::stop_on_signal();
            let opts = crate::worker::ActorOptions {
                endpoint: learner,
                token,
                seed: seed.unwrap_or_else(rand::random),
                wait,
            };
            let r = crate::worker::run(&zmq::Context::new(), &opts, &stop)?;
            writeln!(
                out,
                "sent {} unrolls ({} env steps), rejoined {} times",
                r.unrolls, r.env_steps, r.rejoined
            )?;
            Ok(())
        }
    }
}

fn bench(
    tables: usize,
    devices: usize,
    episodes: usize,
    rounds: usize,
    config: Option<PathBuf>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    use model::mdp::{rollout, MdpTask, Mode};
    use model::nets::{CostNet, PolicyNet};
    anyhow::ensure!(
        tables > 0 && devices > 0 && episodes > 0 && rounds > 0,
        "every count must be at least 1"
    );
    let cfg = Config::load(config.as_deref())?;
    let gen = common::generate::PoolGenConfig {
        tables,
        ..cfg.generate.clone()
    };
    let pool = common::generate::generate_pool(&gen, 0)?;
    tch::set_num_threads(1);
    tch::manual_seed(0);
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let policy = PolicyNet::new(&(vs.root() / "policy"), &cfg.model);
    let cost = CostNet::new(&(vs.root() / "cost"), &cfg.model);
    let task = MdpTask::new(&pool, devices, u64::MAX, &cfg.memory);
    rollout(&policy, &cost, &task, episodes, Mode::Sample { seed: 0 }); // warm-up
    let start = std::time::Instant::now();
    for round in 0..rounds {
        let seed = round as u64 + 1;
        rollout(&policy, &cost, &task, episodes, Mode::Sample { seed });
    }
    let secs = start.elapsed().as_secs_f64();
    let steps = (rounds * episodes * tables) as f64;
    let u = rollout(&policy, &cost, &task, episodes, Mode::Sample { seed: 0 });
    let frame = net::protocol::encode(
        &net::protocol::Header {
            sender: 1,
            incarnation: 1,
            seq: 1,
            policy_version: 1,
        },
        &net::protocol::Message::Unroll(model::wire::unroll_to_data(0, &u)),
    );
    writeln!(
        out,
        "{rounds} rounds × {episodes} episodes × {tables} tables on {devices} devices in {secs:.3} s: \
         {:.0} placement steps/s on one thread ({:.1} ms per lockstep round)",
        steps / secs,
        1e3 * secs / rounds as f64
    )?;
    writeln!(
        out,
        "one unroll of {episodes} episodes is {} bytes on the wire ({:.1} per placement step)",
        frame.len(),
        frame.len() as f64 / (episodes * tables) as f64
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolved_config_round_trips_through_toml() {
        let mut out = Vec::new();
        run(
            Cli {
                command: Command::Config { config: None },
            },
            &mut out,
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        let back = Config::from_toml(&text, std::path::Path::new("resolved.toml")).unwrap();
        assert_eq!(back, Config::default());
    }

    #[test]
    fn a_wait_no_duration_holds_is_an_error_naming_the_option() {
        for wait_s in [1e20, f64::INFINITY, f64::NAN, 0.0] {
            let e = run(
                Cli {
                    command: Command::Run {
                        learner: "inproc://nobody".into(),
                        token_file: None,
                        seed: Some(1),
                        wait_s,
                    },
                },
                &mut Vec::new(),
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains("--wait-s"), "{wait_s}: {e}");
        }
    }
}
