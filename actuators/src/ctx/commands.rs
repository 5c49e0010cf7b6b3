//! The steps of a change that run commands rather than write files:
//! external tools (their undo commands journalled first) and network
//! objects in a namespace (qdiscs, TC filters), each undone by a command.

use qosd_core::Resource;

use super::Ctx;
use crate::error::Result;
use crate::journal::Entry;
use crate::Change;

impl Ctx {
    /// Runs an external tool after recording `undos`: (key, command)
    /// pairs that put back what it changes (the first per key is kept).
    pub fn run(
        &mut self,
        resource: Resource,
        argv: &[String],
        undos: Vec<(String, Vec<String>)>,
    ) -> Result<()> {
        for (key, undo) in undos {
            let entry = Entry::Command {
                resource,
                key,
                argv: undo,
            };
            self.journal.record(entry.clone())?;
            self.txn.push(entry);
        }
        if !self.dry_run {
            crate::tool::run(argv)?;
        }
        self.note(Change::new(resource, argv.join(" "), "", "run"));
        Ok(())
    }

    /// Makes a network object in `netns`: records `undo` (the command that
    /// removes it, keyed by `key`; the first per key is kept) first, then
    /// runs `argv` there when given (`None`: the caller makes the object
    /// itself, e.g. attaches a BPF program over netlink, right after).
    pub fn net(
        &mut self,
        knob: &'static str,
        netns: &crate::netns::NetnsRef,
        argv: Option<&[String]>,
        key: &str,
        undo: Vec<String>,
    ) -> Result<()> {
        crate::netns::check_undo(&undo)?;
        let entry = Entry::Net {
            knob: knob.to_owned(),
            key: key.to_owned(),
            netns: netns.clone(),
            argv: undo,
        };
        self.journal.record(entry.clone())?;
        self.txn.push(entry);
        let shown = argv.map(|a| a.join(" ")).unwrap_or_else(|| key.to_owned());
        if let (Some(argv), false) = (argv, self.dry_run) {
            netns.run(argv)?;
        }
        self.note(Change::knob(knob, shown, "", "run"));
        Ok(())
    }

    /// Journals how to remove a TC program qosd is about to attach to
    /// `dev`'s `dir` hook (`ingress`/`egress`) at priority `pref`: always
    /// only qosd's filter (by its priority), and, when qosd makes the
    /// clsact qdisc (none there yet), the qdisc too, recorded first so it
    /// is restored last, and removed only if no filter is left on it
    /// ([`crate::netns::clsact_in_use`]): another tool's filters, or
    /// another qosd part's, keep it. A clsact qdisc that was there before
    /// is never removed. Keys start with `prefix`.
    pub fn tc_hook(
        &mut self,
        knob: &'static str,
        ns: &crate::netns::NetnsRef,
        prefix: &str,
        dev: &str,
        dir: &str,
        pref: u32,
    ) -> Result<()> {
        let sv = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let qdiscs = ns.run(&sv(&["tc", "qdisc", "show", "dev", dev]))?;
        if !qdiscs.lines().any(|l| l.starts_with("qdisc clsact")) {
            let undo = sv(&["tc", "qdisc", "del", "dev", dev, "clsact"]);
            self.net(knob, ns, None, &format!("{prefix}clsact:{dev}"), undo)?;
        }
        let pref = pref.to_string();
        let undo = sv(&["tc", "filter", "del", "dev", dev, dir, "pref", &pref]);
        self.net(knob, ns, None, &format!("{prefix}filter:{dev}:{dir}"), undo)
    }
}
