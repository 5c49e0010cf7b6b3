//! `qosd replay`: run a scenario, on this machine's real servers or on the
//! simulated node (`--sim`), with the same policy code as the daemon, and
//! write `timeline.csv`, `summary.json` and the plots.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args as ClapArgs;
use qosd_core::{Feedback, Policy, Resource};
use qosd_scenarios::calibrate::{self, Calibration};
use qosd_scenarios::output;
use qosd_scenarios::scenario::Scenario;
use qosd_scenarios::sim::fitted::ModelFile;
use qosd_scenarios::sim::{self, SimOptions, StaticPolicy};
use qosd_scenarios::timeline::{Summary, Timeline};

use crate::node::real_replay::{self, RealOptions};
use crate::node::setup::{parse_resource, read_scenario, resources, run_meta};
use crate::usage;

#[derive(ClapArgs, Debug, Clone)]
#[command(after_help = "Examples:\n  \
    qosd replay scenarios/ramp.yaml --sim              simulated 16-core node, PARTIES, eBPF\n  \
    qosd replay scenarios/ramp.yaml --sim --out out/ramp-ebpf\n  \
    qosd replay scenarios/ramp.yaml --sim --feedback client --out out/ramp-client\n  \
    qosd compare out/ramp-ebpf out/ramp-client                 table and overlay plot\n  \
    qosd replay scenarios/ramp.yaml --sim --policy static      the static-allocation baseline\n  \
    qosd replay scenarios/ramp.yaml --sim --duration 60        the scenario compressed into 60 s\n  \
    qosd replay scenarios/ramp.yaml --sim --model out/model.yaml   on the sim fitted to a machine\n  \
    qosd replay scenarios/ramp.yaml --out out/ramp             on this machine's real servers\n  \
    qosd replay scenarios/demo.yaml --resources cores,cpu_quota  only these knobs (real replays)\n  \
    qosd restore --state-file out/ramp/state.json              undo a real replay that was killed\n\n\
    Outputs (in --out, default out/<scenario>/): timeline.csv,\n\
    summary.json, calibration.json, timeline.svg, timeline.png and plans.jsonl\n\
    (the decision log: one JSON line per decision, sim and real alike).\n\
    A real replay records the original of every knob it changes in its own state\n\
    file (--state-file, default <out>/state.json), not in the daemon's\n\
    /run/qosd/state.json: it runs beside a `qosd run` daemon on the same node, and\n\
    after a SIGKILL `qosd restore --state-file <out>/state.json` puts the knobs back\n\
    (the next replay into the same --out does it too). Beside a daemon, both share\n\
    the node's CPUs without knowing of each other: use distinct app names.\n\
    Loads in a scenario are fractions of each app's capacity; the capacity and the\n\
    knee (where targets with knee_factor sit) come from calibration: of the model\n\
    with --sim, of this machine otherwise (or --calibration FILE from `qosd calibrate`).")]
pub struct Args {
    /// Scenario file (scenarios/*.yaml).
    pub scenario: PathBuf,
    /// Latency fed to the policy: ebpf (server side) or client (load
    /// generator). Default: the scenario's.
    #[arg(long, value_parser = parse_feedback)]
    pub feedback: Option<Feedback>,
    /// Policy file, or `static` for the static even split. Default: the
    /// scenario's (policies/parties.yaml).
    #[arg(long, value_name = "FILE")]
    pub policy: Option<String>,
    /// Replay on the simulated node (deterministic, faster than real time).
    #[arg(long)]
    pub sim: bool,
    /// With --sim: the node and app models fitted to a machine by
    /// `qosd calibrate --model FILE` (instead of the scenario's node and
    /// the server kinds' defaults).
    #[arg(long, value_name = "FILE", requires = "sim")]
    pub model: Option<PathBuf>,
    /// Seed (arrivals, noise, the policy's choices). Default: the scenario's.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Output folder.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Length of the run, seconds: the scenario's time axis is stretched or
    /// compressed to it. Default: the scenario's duration_s.
    #[arg(long, allow_negative_numbers = true, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Calibration to use instead of calibrating (calibration.json).
    #[arg(long, value_name = "FILE")]
    pub calibration: Option<PathBuf>,
    /// Actuator state file of a real replay: the original of every knob
    /// it changes, for `qosd restore --state-file FILE` after a SIGKILL.
    /// Default: <out>/state.json (the daemon's is /run/qosd/state.json).
    #[arg(long, value_name = "FILE", conflicts_with = "sim")]
    pub state_file: Option<PathBuf>,
    /// Knobs the policy may turn, comma-separated (cores, frequency,
    /// cache_ways, memory_bandwidth, cpu_quota; e.g. `cpu_quota`: the apps
    /// share every CPU, quota moves). Default: the scenario's
    /// `resources:`, else every knob the machine (or the sim's `node:`)
    /// has.
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_resource)]
    pub resources: Option<Vec<Resource>>,
    /// Real replays: where the request sensor aggregates.
    #[command(flatten)]
    pub aggregate: crate::cmd::trace::AggregateArg,
    /// Print summary.json instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Run N times (seeds --seed, --seed+1, ...: on --sim N seeds, on real
    /// servers N repetitions) into <out>/seed-<S>/, and print each
    /// figure's mean and 95 % confidence interval (also <out>/seeds.json).
    #[arg(long, value_name = "N")]
    pub seeds: Option<u32>,
}

fn parse_feedback(s: &str) -> Result<Feedback, String> {
    match s {
        "ebpf" => Ok(Feedback::Ebpf),
        "client" => Ok(Feedback::Client),
        _ => Err(format!("{s:?}: ebpf or client")),
    }
}

/// The policy a replay runs: a file, the scenario's, or `static`.
pub fn load_policy(
    scenario: &Scenario,
    arg: Option<&str>,
    seed: u64,
) -> anyhow::Result<Box<dyn Policy + Send>> {
    if arg == Some("static") {
        return Ok(Box::new(StaticPolicy));
    }
    let path = match arg {
        Some(p) => PathBuf::from(p),
        None => scenario.policy_path().ok_or_else(|| {
            usage!(
                "{}: no policy in the scenario; give --policy FILE or --policy static",
                scenario.name
            )
        })?,
    };
    let names = scenario.apps.iter().map(|a| a.name.as_str()).collect();
    let f = crate::policy::PolicyFile::load_for(&path, &names).map_err(|e| usage!("{e}"))?;
    Ok(f.build(seed))
}

/// `--seeds N`: N runs, then the aggregate.
fn run_seeds(args: Args, n: u32) -> anyhow::Result<()> {
    if !(1..=1000).contains(&n) {
        return Err(usage!("--seeds {n}: must be in 1..=1000"));
    }
    let sc = read_scenario(&args.scenario)?;
    let base = args.seed.unwrap_or(sc.seed);
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("out/{}", sc.name)));
    let mut summaries = Vec::new();
    for k in 0..u64::from(n) {
        let seed = base.wrapping_add(k);
        let dir = out.join(format!("seed-{seed}"));
        eprintln!("== seed {seed} -> {}", dir.display());
        let a = Args {
            seed: Some(seed),
            out: Some(dir.clone()),
            seeds: None,
            json: false,
            ..args.clone()
        };
        run(a)?;
        let text =
            crate::yamlfile::read_kind(&dir.join("summary.json"), crate::yamlfile::Kind::Summary)?;
        summaries.push(serde_json::from_str(&text).context("parsing summary.json")?);
    }
    let agg = qosd_scenarios::seeds::aggregate(&summaries);
    let path = out.join("seeds.json");
    std::fs::write(&path, serde_json::to_string_pretty(&agg)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    crate::outln!("\n{}", qosd_scenarios::seeds::table(&agg))?;
    crate::outln!("wrote {}", path.display())?;
    Ok(())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(n) = args.seeds {
        return run_seeds(args, n);
    }
    let mut sc = read_scenario(&args.scenario)?;
    apply_args(&args, &mut sc)?;
    let feedback = args.feedback.unwrap_or(sc.feedback);
    let seed = args.seed.unwrap_or(sc.seed);
    let mut policy = load_policy(&sc, args.policy.as_deref(), seed)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("out/{}", sc.name)));
    if args.sim && args.aggregate.choice.is_some() {
        return Err(usage!(
            "--aggregate: for real replays only (the simulated node has no eBPF sensor)"
        ));
    }
    if !args.sim {
        let o = RealOptions {
            resources: args.resources.as_deref(),
            state_file: args.state_file.clone(),
            calibration: args.calibration.clone(),
            duration: args.duration,
            policy: args.policy.as_deref(),
            aggregate: args.aggregate.get(),
        };
        return real_replay::run(&sc, &o, feedback, seed, policy.as_mut(), &out);
    }
    let cal = match &args.calibration {
        Some(p) => Calibration::read(p).map_err(|e| usage!("{}: {e:#}", p.display()))?,
        None => calibrate::sim(&sc),
    };
    let t0 = std::time::Instant::now();
    let opts = SimOptions {
        feedback,
        seed,
        duration_s: args.duration,
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let plans = std::fs::File::create(out.join("plans.jsonl")).context("creating plans.jsonl")?;
    let plans = Box::new(std::io::BufWriter::new(plans));
    let mut tl = sim::run_with(&sc, &cal, policy.as_mut(), &opts, Some(plans));
    tl.meta.extend(run_meta(&sc, args.policy.as_deref()));
    let wall = t0.elapsed().as_secs_f64();
    let (summary, files) =
        output::write_run(&out, &tl, &cal).context("writing the replay's outputs")?;
    if args.json {
        crate::outln!("{}", serde_json::to_string_pretty(&summary)?)?;
        return Ok(());
    }
    let run = SimRun {
        tl: &tl,
        summary: &summary,
        files: &files,
        out: &out,
    };
    print_sim_run(&args, &sc, &run, (feedback, seed, wall))?;
    Ok(())
}

/// What the arguments change in the scenario: its duration checked, a
/// fitted model laid over it, the simulated node's knobs.
fn apply_args(args: &Args, sc: &mut Scenario) -> anyhow::Result<()> {
    if let Some(d) = args.duration {
        crate::secs::secs("--duration", d, 0.0, 86_400.0)?;
        qosd_scenarios::scenario::run_size(d, sc.interval_ms, sc.apps.len())
            .map_err(|m| usage!("--duration {m}"))?;
    }
    if let Some(p) = &args.model {
        let m = ModelFile::from_file(p).map_err(|e| usage!("{e}"))?;
        m.apply(sc)
            .map_err(|e| usage!("--model {}: {e}", p.display()))?;
    }
    if args.sim && (args.resources.is_some() || sc.resources.is_some()) {
        // The simulated node offers the knobs a real replay would turn.
        let rs = resources(sc, args.resources.as_deref())?;
        sc.node = sc.node.only(&rs);
    }
    Ok(())
}

/// What a simulated run made.
struct SimRun<'a> {
    tl: &'a Timeline,
    summary: &'a Summary,
    files: &'a output::RunFiles,
    out: &'a std::path::Path,
}

/// A simulated run's node, its speed, the summary table and the files
/// written.
fn print_sim_run(
    args: &Args,
    sc: &Scenario,
    run: &SimRun<'_>,
    (feedback, seed, wall): (Feedback, u64, f64),
) -> anyhow::Result<()> {
    let SimRun {
        tl,
        summary,
        files,
        out,
    } = *run;
    let simulated = tl.rows.len() as f64 / tl.apps.len().max(1) as f64 * tl.interval_s;
    crate::outln!(
        "{} on the simulated node ({} {}, {}-{} MHz, {} ways, {}){}: policy {}, feedback {feedback}, seed {seed}",
        sc.name,
        sc.node.nr_cores,
        if sc.node.shared_cpus { "shared CPUs" } else { "cores" },
        sc.node.freq_min_mhz,
        sc.node.freq_max_mhz,
        sc.node.nr_ways,
        match sc.node.quota_step_milli {
            0 => "no quota".to_string(),
            q => format!("quota step {q} m-CPU"),
        },
        args.model
            .as_ref()
            .map_or(String::new(), |p| format!(" fitted by {}", p.display())),
        tl.policy
    )?;
    crate::outln!(
        "simulated {simulated:.0} s in {wall:.3} s ({:.0}x real time)\n",
        simulated / wall.max(1e-9)
    )?;
    crate::out!("{}", output::summary_table(summary))?;
    if tl.rejected_plans > 0 {
        crate::outln!(
            "warning: {} plans were outside the node and were not applied",
            tl.rejected_plans
        )?;
    }
    if tl.cannot_meet > 0 {
        crate::outln!(
            "{} cannot-meet-QoS events (a violating app nothing could be given to): see plans.jsonl",
            tl.cannot_meet
        )?;
    }
    crate::outln!("\nwrote {}", files.timeline_csv.display())?;
    crate::outln!("      {}", files.summary_json.display())?;
    crate::outln!("      {} and .png", files.plot_svg.display())?;
    crate::outln!("      {}", out.join("plans.jsonl").display())?;
    Ok(())
}
