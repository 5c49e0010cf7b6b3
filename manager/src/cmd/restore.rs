//! `qosd restore`: replay the state file (what `qosd set`, or a qosd that
//! was killed, changed) and remove it.

use std::path::PathBuf;

use clap::Args as ClapArgs;
use qosd_actuators::{restore_state_file, Config};

#[derive(ClapArgs, Debug)]
#[command(after_help = "Examples:\n  \
    qosd restore                          put back everything in /run/qosd/state.json\n  \
    qosd restore --dry-run                show what would be put back\n  \
    qosd restore --state-file /tmp/s.json a state file of another run\n  \
    qosd restore --config /etc/qosd/config.yaml  the state file of that config's `qosd run`\n  \
    qosd restore --state-file out/ramp/state.json  what a killed `qosd replay` left\n\n\
    The state file records each original before the first change, so this\n\
    works after `qosd set`, and after a qosd that was killed with SIGKILL.\n\
    A real `qosd replay` journals to its own file, <out>/state.json (or its\n\
    --state-file), not to /run/qosd/state.json.")]
pub struct Args {
    /// Take the state file and root from this config (what `qosd run
    /// --config FILE` journals to); the systemd unit's ExecStopPost uses it.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["state_file", "root"])]
    pub config: Option<PathBuf>,
    /// State file to replay; default <root>/run/qosd/state.json.
    #[arg(long, value_name = "PATH")]
    pub state_file: Option<PathBuf>,
    /// Root prefix the default state file is under (the root the changes
    /// were made under is recorded in the file itself).
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// Show what would be restored; change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let (root, state_file) = match &args.config {
        Some(path) => {
            let (c, _policy) =
                crate::config::Config::load(path).map_err(|e| crate::usage!("{e}"))?;
            (c.actuators.root, c.state_file)
        }
        None if !args.root.is_absolute() => {
            return Err(crate::usage!(
                "--root {}: must be an absolute path",
                args.root.display()
            ))
        }
        None => (args.root, args.state_file),
    };
    let cfg = Config {
        root,
        state_file,
        ..Config::default()
    };
    let path = cfg.state_path();
    if !path.exists() {
        crate::outln!("nothing to restore: no {}", path.display())?;
        return Ok(());
    }
    let changes = restore_state_file(&path, args.dry_run).map_err(crate::exit::to_anyhow)?;
    let verb = if args.dry_run {
        "would restore"
    } else {
        "restored"
    };
    for c in &changes {
        crate::outln!("{verb} {c}")?;
    }
    if changes.is_empty() {
        crate::outln!(
            "nothing to restore (the processes recorded in {} are gone)",
            path.display()
        )?;
    }
    Ok(())
}
