//! One role's settings as `efa-env print` writes them: shell lines for
//! `eval`, a systemd EnvironmentFile, or JSON with the reasons.
use super::decision::{Facts, Role, Setting};
use serde::Serialize;

/// `export`/`unset` lines with the reasons as comments, for `eval`.
pub fn render_sh(role: Role, f: &Facts, settings: &[Setting]) -> String {
    let mut out = format!("# tally efa-env print --role {role} ({})\n", facts_summary(f));
    for s in settings {
        out.push_str(&format!("# {}: {}\n", s.name, s.reason));
        match &s.value {
            Some(v) => out.push_str(&format!("export {}={}\n", s.name, sh_quote(v))),
            None => out.push_str(&format!("unset {}\n", s.name)),
        }
    }
    out
}

/// A systemd EnvironmentFile: `NAME=value` lines. A file cannot unset a
/// variable, so those become comments naming the unit directive that does.
pub fn render_systemd(role: Role, f: &Facts, settings: &[Setting]) -> String {
    let mut out = format!("# EnvironmentFile: tally efa-env print --role {role} --format systemd ({})\n", facts_summary(f));
    for s in settings {
        match &s.value {
            Some(v) => {
                out.push_str(&format!("# {}\n", s.reason));
                out.push_str(&format!("{}={v}\n", s.name));
            }
            None => out.push_str(&format!("# {} must stay unset (UnsetEnvironment={} in the unit): {}\n", s.name, s.name, s.reason)),
        }
    }
    out
}

#[derive(Serialize)]
pub(super) struct PrintJson<'a> {
    pub(super) role: Role,
    pub(super) facts: &'a Facts,
    pub(super) settings: Vec<SettingJson<'a>>,
}

#[derive(Serialize)]
pub(super) struct SettingJson<'a> {
    pub(super) name: &'a str,
    pub(super) action: &'a str,
    pub(super) value: Option<&'a str>,
    pub(super) reason: &'a str,
}

pub(super) fn settings_json(settings: &[Setting]) -> Vec<SettingJson<'_>> {
    settings
        .iter()
        .map(|s| SettingJson {
            name: s.name,
            action: if s.value.is_some() { "set" } else { "unset" },
            value: s.value.as_deref(),
            reason: &s.reason,
        })
        .collect()
}

pub(super) fn sh_quote(v: &str) -> String {
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.,:/".contains(&b)) {
        v.to_string()
    } else {
        format!("'{}'", v.replace('\'', "'\\''"))
    }
}

pub(super) fn facts_summary(f: &Facts) -> String {
    let kernel = f.kernel.map_or("kernel unknown".to_string(), |k| format!("kernel {k}"));
    let rdma = match (f.rdma_core_present, f.rdma_core_release) {
        (false, _) => "no rdma-core".to_string(),
        (true, Some(r)) => format!("rdma-core {r}"),
        (true, None) => "rdma-core".to_string(),
    };
    let efa = if f.efa_device { "EFA present" } else { "no EFA device" };
    format!("{kernel}, {rdma}, libfabric {}.{}, {efa}", f.libfabric.0, f.libfabric.1)
}
