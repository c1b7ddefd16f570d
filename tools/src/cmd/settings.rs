//! `tally settings`: every `TALLY_*` variable and server configuration key,
//! with its default, who reads it and what it does.
//!
//! The tables live in `tally_engine::settings`; this prints them, as aligned
//! text for a terminal or, with `--markdown`, exactly as README.md and
//! docs/nccl.md hold them (each after the marker line that names this
//! command), so that the docs are regenerated rather than edited by hand.
use crate::host::table::{Align, Table as TextTable};
use clap::Args;
use tally_engine::settings::{Reader, Table};

#[derive(Args, Debug)]
pub struct SettingsArgs {
    /// Print markdown tables, each after its marker line, as the docs hold them.
    #[arg(long)]
    pub markdown: bool,
    /// Only this table: env, workers (what an NCCL job's processes read), config or development.
    #[arg(long, value_name = "NAME", value_parser = parse_table)]
    pub table: Option<Table>,
}

fn parse_table(s: &str) -> Result<Table, String> {
    Table::parse(s).ok_or_else(|| format!("unknown table {s:?}: expected one of {}", Table::ALL.map(|t| t.name()).join(", ")))
}

pub fn run(args: &SettingsArgs) -> Result<(), String> {
    print!("{}", render(args.table, args.markdown));
    Ok(())
}

/// The chosen tables, blank-line separated. When `only` is None: all of
/// them in markdown (every table the docs hold); as text, all but the
/// workers' (rows of the environment table again).
pub fn render(only: Option<Table>, markdown: bool) -> String {
    let tables: Vec<Table> = match only {
        Some(t) => vec![t],
        None => Table::ALL.into_iter().filter(|&t| markdown || t != Table::Workers).collect(),
    };
    let blocks: Vec<String> =
        tables.into_iter().map(|t| if markdown { format!("{}\n{}", t.marker(), t.markdown()) } else { text(t) }).collect();
    blocks.join("\n")
}

/// A table as aligned text under its title, without markdown's backticks,
/// and the legend of the `read by` column where it has one.
fn text(t: Table) -> String {
    let mut table = TextTable::new(&t.headers().iter().map(|h| (*h, Align::Left)).collect::<Vec<_>>());
    for row in t.rows() {
        table.row(row.iter().map(|c| c.replace('`', "")));
    }
    let mut out = format!("{}\n\n{}", t.title(), table.render());
    if t.headers().contains(&"read by") {
        out.push('\n');
        for r in Reader::ALL {
            out.push_str(&format!("  {:<8} {}\n", r.name(), r.meaning().replace('`', "")));
        }
    }
    out
}
