//! Every setting tally reads, in one place: the `TALLY_*` environment
//! variables and the server's configuration keys, each with its default,
//! who reads it and what it does.
//!
//! The code that reads a variable stays where it is (`client/mod.rs` reads the
//! client's, `fabric/info.rs` the provider, the plugin its own); this module
//! is the list of them, the one source that `tally settings` prints and that
//! README.md and docs/nccl.md hold as tables (`tally settings --markdown`).
//! The rows are in `settings/rows.rs`. tools/tests/settings_table.rs keeps
//! the three in step: every `TALLY_*` name the sources or scripts use is a
//! row, every row is used, the docs
//! hold exactly the generated tables, and each default written here is the
//! one the code applies where the code can be asked (a named constant,
//! `ClientConfig::new`, `ServerFile::resolve`).
//!
//! Defaults are written as one would set them (`256K`, `2000`): that text is
//! what the test compares. What else decides a default (the plugin's own
//! choice over tcp, "auto") goes in a note beside it.

/// Who reads a variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    /// `tally server` (the engine's server).
    Server,
    /// The client library (`tally_engine::client`): the NCCL plugin's
    /// CollNet and `tally bench`'s ranks.
    Client,
    /// libnccl-net-tally.so's own code (its ncclNet, its CollNet set-up).
    Plugin,
    /// The other `tally` subcommands (bench, demo).
    Tools,
    /// tally's own test suites.
    Tests,
    /// Shell and Python scripts of the repository (scripts/, tests/nccl/, config/).
    Scripts,
}

impl Reader {
    pub const ALL: [Reader; 6] = [Reader::Server, Reader::Client, Reader::Plugin, Reader::Tools, Reader::Tests, Reader::Scripts];

    pub fn name(self) -> &'static str {
        match self {
            Reader::Server => "server",
            Reader::Client => "client",
            Reader::Plugin => "plugin",
            Reader::Tools => "tools",
            Reader::Tests => "tests",
            Reader::Scripts => "scripts",
        }
    }

    /// What the name stands for, for a legend under a table.
    pub fn meaning(self) -> &'static str {
        match self {
            Reader::Server => "`tally server`",
            Reader::Client => "the client library: the NCCL plugin's CollNet and `tally bench`",
            Reader::Plugin => "libnccl-net-tally.so itself",
            Reader::Tools => "the other `tally` subcommands",
            Reader::Tests => "tally's test suites",
            Reader::Scripts => "scripts/, tests/nccl/, config/",
        }
    }
}

/// Whether a variable is one a deployment sets, or one of tally's own
/// tests, fault injection and scripts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Audience {
    Operators,
    Development,
}

/// A `TALLY_*` environment variable.
#[derive(Clone, Copy, Debug)]
pub struct EnvVar {
    pub name: &'static str,
    /// The value in effect while it is unset, written as one would set it;
    /// empty where no single value says it (then `note` does).
    pub default: &'static str,
    /// What else decides the default, or what unset means.
    pub note: &'static str,
    pub readers: &'static [Reader],
    pub audience: Audience,
    /// One line; `code` in backticks (markdown).
    pub effect: &'static str,
}

/// A key of the server's TOML configuration (`tally server --config FILE`).
#[derive(Clone, Copy, Debug)]
pub struct ConfigKey {
    pub key: &'static str,
    /// The `tally server` flag that overrides it; empty: file only.
    pub flag: &'static str,
    /// As [`EnvVar::default`]: a value as the file would hold it, or empty.
    pub default: &'static str,
    pub note: &'static str,
    pub effect: &'static str,
}

mod rows;
pub use rows::{CONFIG_KEYS, ENV};
use Audience::{Development, Operators};
use Reader::{Client, Plugin};

/// The tables `tally settings` prints and the docs hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    /// The variables a deployment sets (README.md).
    Env,
    /// Of those, the ones an NCCL worker's processes read (docs/nccl.md).
    Workers,
    /// The server's configuration keys (README.md).
    Config,
    /// Variables of tally's own tests, fault injection and scripts (README.md).
    Development,
}

impl Table {
    pub const ALL: [Table; 4] = [Table::Env, Table::Workers, Table::Config, Table::Development];

    /// As `--table` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Table::Env => "env",
            Table::Workers => "workers",
            Table::Config => "config",
            Table::Development => "development",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Table::Env => "Environment variables",
            Table::Workers => "Environment variables of NCCL workers (the client library and the plugin)",
            Table::Config => "Server configuration keys (tally server --config FILE; a flag overrides its key)",
            Table::Development => "Variables of tally's own tests, fault injection and scripts",
        }
    }

    pub fn parse(name: &str) -> Option<Table> {
        Table::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The line that stands before the table in a markdown document, naming
    /// the command that prints it (an HTML comment: invisible when rendered).
    pub fn marker(self) -> String {
        format!("<!-- tally settings --markdown --table {} -->", self.name())
    }

    pub fn headers(self) -> &'static [&'static str] {
        match self {
            Table::Env | Table::Development => &["variable", "default", "read by", "what it does"],
            Table::Workers => &["variable", "default", "what it does"],
            Table::Config => &["key", "flag", "default", "what it does"],
        }
    }

    /// The variables of an environment table, in table order.
    pub fn vars(self) -> Vec<&'static EnvVar> {
        ENV.iter()
            .filter(|v| match self {
                Table::Env => v.audience == Operators,
                Table::Workers => v.audience == Operators && v.readers.iter().any(|r| matches!(r, Client | Plugin)),
                Table::Development => v.audience == Development,
                Table::Config => false,
            })
            .collect()
    }

    /// The cells of each row, markdown inline code in backticks.
    pub fn rows(self) -> Vec<Vec<String>> {
        if self == Table::Config {
            return CONFIG_KEYS
                .iter()
                .map(|k| {
                    let flag = if k.flag.is_empty() { "(file only)".to_string() } else { format!("`{}`", k.flag) };
                    vec![format!("`{}`", k.key), flag, default_cell(k.default, k.note), k.effect.to_string()]
                })
                .collect();
        }
        self.vars()
            .into_iter()
            .map(|v| {
                let mut row = vec![format!("`{}`", v.name), default_cell(v.default, v.note)];
                if self != Table::Workers {
                    row.push(v.readers.iter().map(|r| r.name()).collect::<Vec<_>>().join(", "));
                }
                row.push(v.effect.to_string());
                row
            })
            .collect()
    }

    /// The table in markdown, one line per row, each ending in a newline.
    pub fn markdown(self) -> String {
        let mut out = String::new();
        let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
        out.push_str(&line(&self.headers().iter().map(|h| h.to_string()).collect::<Vec<_>>()));
        out.push_str(&format!("|{}\n", "---|".repeat(self.headers().len())));
        for row in self.rows() {
            out.push_str(&line(&row));
        }
        out
    }
}

/// `` `256K` ``, `` `256K` (note) `` or the note alone.
fn default_cell(default: &str, note: &str) -> String {
    match (default.is_empty(), note.is_empty()) {
        (false, true) => format!("`{default}`"),
        (false, false) => format!("`{default}` ({note})"),
        (true, _) => note.to_string(),
    }
}

/// The row of variable `name`, if tally knows it.
pub fn env_var(name: &str) -> Option<&'static EnvVar> {
    ENV.iter().find(|v| v.name == name)
}

/// The row of configuration key `key`.
pub fn config_key(key: &str) -> Option<&'static ConfigKey> {
    CONFIG_KEYS.iter().find(|k| k.key == key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn names_are_unique_and_well_formed() {
        let mut seen = BTreeSet::new();
        for v in ENV {
            assert!(seen.insert(v.name), "{} twice", v.name);
            assert!(v.name.starts_with("TALLY_") && v.name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'));
            assert!(!v.readers.is_empty(), "{}: who reads it?", v.name);
            assert!(!v.default.is_empty() || !v.note.is_empty(), "{}: no default and no note", v.name);
        }
        let mut keys = BTreeSet::new();
        for k in CONFIG_KEYS {
            assert!(keys.insert(k.key), "{} twice", k.key);
            assert!(k.flag.is_empty() || k.flag.starts_with("--"), "{}: flag {}", k.key, k.flag);
            assert!(!k.default.is_empty() || !k.note.is_empty(), "{}: no default and no note", k.key);
        }
    }

    /// A `|` would split a markdown cell; a line break would end the row;
    /// `<` outside code would be read as HTML.
    #[test]
    fn cells_are_markdown_safe() {
        for t in Table::ALL {
            for row in t.rows() {
                assert_eq!(row.len(), t.headers().len());
                for cell in row {
                    assert!(!cell.is_empty(), "{}: an empty cell", t.name());
                    assert!(!cell.contains(['|', '\n']), "{}: {cell}", t.name());
                    let prose: String = cell.split('`').step_by(2).collect();
                    assert!(!prose.contains('<'), "{}: {cell}", t.name());
                    assert_eq!(cell.matches('`').count() % 2, 0, "{}: unbalanced backticks in {cell}", t.name());
                }
            }
        }
    }

    #[test]
    fn tables_split_the_variables() {
        let env: BTreeSet<&str> = Table::Env.vars().iter().map(|v| v.name).collect();
        let dev: BTreeSet<&str> = Table::Development.vars().iter().map(|v| v.name).collect();
        assert_eq!(env.len() + dev.len(), ENV.len());
        assert!(env.is_disjoint(&dev));
        let workers: BTreeSet<&str> = Table::Workers.vars().iter().map(|v| v.name).collect();
        assert!(workers.is_subset(&env));
        for name in ["TALLY_SERVERS", "TALLY_TOKEN", "TALLY_LIVENESS_MS", "TALLY_PROVIDER_WATCHDOG_S", "TALLY_NET_LANES"] {
            assert!(workers.contains(name), "{name}");
        }
        for name in ["TALLY_LOG", "TALLY_ISA", "TALLY_IPROUTE"] {
            assert!(!workers.contains(name), "{name}");
        }
        let md = Table::Config.markdown();
        assert!(md.starts_with("| key | flag | default | what it does |\n|---|---|---|---|\n"), "{md}");
        assert_eq!(md.lines().count(), CONFIG_KEYS.len() + 2);
        assert!(md.contains("| `heartbeat_ms` | `--heartbeat-ms` | `250` | "), "{md}");
        for t in Table::ALL {
            assert_eq!(Table::parse(t.name()), Some(t));
        }
        assert_eq!(Table::parse("nope"), None);
    }
}
