//! `qosd completions bash|zsh|fish` and `qosd completions --man DIR`:
//! shell completions and man pages generated from the very clap
//! definitions the binary parses with, so they cannot drift from it.
//! `main.rs` passes its `Cli::command()` in (the definitions live there).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args as ClapArgs, ValueEnum};
use clap_complete::Shell as CShell;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(ClapArgs, Debug)]
#[command(after_help = "Examples:\n  \
    qosd completions bash > /usr/share/bash-completion/completions/qosd\n  \
    qosd completions zsh  > /usr/local/share/zsh/site-functions/_qosd\n  \
    qosd completions fish > ~/.config/fish/completions/qosd.fish\n  \
    qosd completions --man target/man      qosd.1, qosd-run.1, ... (`make man`)\n\n\
    `make install` installs the bash, zsh and fish files and the man pages.")]
pub struct Args {
    /// Shell to print a completion script for (to stdout).
    #[arg(value_enum, required_unless_present = "man")]
    pub shell: Option<Shell>,
    /// Write man pages (section 1: qosd.1 and one per subcommand) into DIR
    /// instead.
    #[arg(long, value_name = "DIR", conflicts_with = "shell")]
    pub man: Option<PathBuf>,
}

/// `cli` is the binary's top-level `clap::Command` (`Cli::command()`).
pub fn run(args: Args, cli: clap::Command) -> anyhow::Result<()> {
    if let Some(dir) = &args.man {
        let pages = write_man(cli, dir)?;
        for p in pages {
            crate::outln!("{}", p.display())?;
        }
        return Ok(());
    }
    let shell = match args.shell {
        Some(Shell::Bash) => CShell::Bash,
        Some(Shell::Zsh) => CShell::Zsh,
        Some(Shell::Fish) => CShell::Fish,
        // clap enforces `required_unless_present = "man"`.
        None => return Err(crate::usage!("name a shell: bash, zsh or fish")),
    };
    let mut cli = cli;
    let name = cli.get_name().to_owned();
    // Into a buffer first: clap_complete panics on a failed write, and
    // `qosd completions bash | head` closes the pipe early.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cli, name, &mut script);
    let mut out = std::io::stdout().lock();
    match out.write_all(&script).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("writing the completion script to stdout"))
        }
        _ => Ok(()),
    }
}

/// Renders one page per (visible) command into `dir`; returns their paths,
/// sorted.
pub fn write_man(cli: clap::Command, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    clap_mangen::generate_to(cli, dir)
        .with_context(|| format!("writing man pages into {}", dir.display()))?;
    let mut pages: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "1"))
        .collect();
    pages.sort();
    Ok(pages)
}
