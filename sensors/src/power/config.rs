//! Configuration of the power sensor: energy source, the HT ratio of
//! eq. (1), the BPF thread table size and the coefficients of the model used
//! where there is no RAPL. Defaults live here and nowhere else.

use serde::{Deserialize, Serialize};

use super::PowerError;

/// Which energy source to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SourceChoice {
    /// RAPL through powercap sysfs, else perf `power/energy-pkg/`, else the
    /// model (labelled as an estimate).
    #[default]
    Auto,
    /// RAPL through powercap sysfs only; an error if it is missing.
    Powercap,
    /// RAPL through the perf `power` PMU only; an error if it is missing.
    Perf,
    /// The model even where RAPL exists (e.g. to compare the two).
    Model,
}

/// The power sensor's settings (`power:` in the daemon config).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PowerConfig {
    /// Energy source: auto, powercap, perf or model.
    pub source: SourceChoice,
    /// HT_r of paper 001 eq. (1): core power with both hyperthreads busy ÷
    /// core power with one busy (dimensionless; 1.1 on Sandy/Ivy Bridge).
    /// Work done while the SMT sibling is busy weighs HT_r / 2.
    pub ht_ratio: f64,
    /// Weigh threads by hardware cycles where every CPU has a cycle counter
    /// (else, and when false, by on-CPU time).
    pub use_cycles: bool,
    /// Entries of the BPF thread table (threads alive at once); kernel
    /// memory = nr_threads_max × possible CPUs × 40 bytes. Switches of
    /// threads that do not fit are counted and reported.
    pub nr_threads_max: u32,
    /// Coefficients of the node power model (used without RAPL).
    pub model: ModelConfig,
}

impl Default for PowerConfig {
    fn default() -> Self {
        PowerConfig {
            source: SourceChoice::Auto,
            ht_ratio: 1.1,
            use_cycles: true,
            nr_threads_max: 16384,
            model: ModelConfig::default(),
        }
    }
}

/// Node power model, per logical CPU c over an interval:
///
/// `P = base_w + Σ_c (idle_w_per_cpu + dynamic_w_per_cpu · u_c · (f_c / f_max,c)^freq_exponent)`
///
/// where `u_c` is the CPU's busy fraction (from the sched program) and
/// `f_c / f_max,c` its current over maximum frequency (cpufreq; taken as 1
/// where cpufreq is missing). `base_w + Σ idle_w_per_cpu` is the idle power;
/// the dynamic terms are the active power that eq. (2) attributes to
/// threads. The defaults are illustrative for one server-class core per CPU;
/// calibrate them against a wall meter or RAPL on the same hardware.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Node power that does not depend on the CPUs' load (uncore, memory,
    /// platform), W.
    pub base_w: f64,
    /// Power of one idle logical CPU, W.
    pub idle_w_per_cpu: f64,
    /// Extra power of one logical CPU busy all the interval at its maximum
    /// frequency, W.
    pub dynamic_w_per_cpu: f64,
    /// Exponent x of the frequency term (f / f_max)^x; dynamic power goes
    /// as f·V², and V falls with f, so 2..3 fits most CPUs.
    pub freq_exponent: f64,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            base_w: 10.0,
            idle_w_per_cpu: 1.0,
            dynamic_w_per_cpu: 5.0,
            freq_exponent: 2.0,
        }
    }
}

fn check(key: &str, v: f64, lo: f64, hi: f64) -> Result<(), PowerError> {
    if v.is_finite() && (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(PowerError::Config {
            key: key.to_owned(),
            reason: format!("{v} is outside {lo}..={hi}"),
        })
    }
}

impl PowerConfig {
    /// Checks every value's range; the error names the key (`power.ht_ratio`).
    pub fn validate(&self) -> Result<(), PowerError> {
        check("power.ht_ratio", self.ht_ratio, 1.0, 2.0)?;
        check(
            "power.nr_threads_max",
            self.nr_threads_max as f64,
            64.0,
            4_194_304.0,
        )?;
        let m = &self.model;
        check("power.model.base_w", m.base_w, 0.0, 100_000.0)?;
        check("power.model.idle_w_per_cpu", m.idle_w_per_cpu, 0.0, 1000.0)?;
        check(
            "power.model.dynamic_w_per_cpu",
            m.dynamic_w_per_cpu,
            0.0,
            1000.0,
        )?;
        check("power.model.freq_exponent", m.freq_exponent, 0.0, 4.0)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_yaml_keys_are_checked() {
        PowerConfig::default().validate().unwrap();
        let yaml = "source: model\nht_ratio: 1.2\nmodel:\n  base_w: 20\n";
        let c: PowerConfig = serde_yaml_ng::from_str(yaml).unwrap();
        assert_eq!(c.source, SourceChoice::Model);
        assert_eq!(c.ht_ratio, 1.2);
        assert_eq!(c.model.base_w, 20.0);
        assert_eq!(c.model.idle_w_per_cpu, 1.0, "unset keys keep defaults");
        let typo = serde_yaml_ng::from_str::<PowerConfig>("ht_raito: 1.2\n");
        assert!(typo.unwrap_err().to_string().contains("ht_raito"));
    }

    #[test]
    fn out_of_range_values_name_their_key() {
        let c = PowerConfig {
            ht_ratio: 3.0,
            ..PowerConfig::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("power.ht_ratio") && e.contains('3'), "{e}");
        let mut c = PowerConfig::default();
        c.model.freq_exponent = f64::NAN;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("power.model.freq_exponent"), "{e}");
    }
}
