//! Aligned text tables, the way `dpdk-hugepages.py -s` and `fi_info` print
//! them: a header row, columns padded to their widest cell, numbers aligned
//! on the right so that digits line up, text on the left.
//!
//! Only the last column is left unpadded, so a long free-text column (a
//! check's result, a reason) does not push trailing spaces onto every line.

/// Which side of its column a cell sticks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A table being built: headers, then rows of the same width.
#[derive(Debug, Clone)]
pub struct Table {
    headers: Vec<String>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these columns; `align` gives each column's side.
    pub fn new(columns: &[(&str, Align)]) -> Table {
        Table {
            headers: columns.iter().map(|(h, _)| h.to_string()).collect(),
            align: columns.iter().map(|(_, a)| *a).collect(),
            rows: Vec::new(),
        }
    }

    /// Add one row; missing cells are blank, extra cells are an error in the
    /// caller and are dropped.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        let mut cells: Vec<String> = cells.into_iter().map(Into::into).collect();
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    /// The table as text, one line per row, each ending in a newline.
    pub fn render(&self) -> String {
        let n = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for line in std::iter::once(&self.headers).chain(&self.rows) {
            let mut text = String::new();
            for (i, cell) in line.iter().enumerate() {
                let last = i + 1 == n;
                let pad = widths[i].saturating_sub(cell.chars().count());
                match self.align[i] {
                    Align::Right => {
                        text.push_str(&" ".repeat(pad));
                        text.push_str(cell);
                    }
                    Align::Left => {
                        text.push_str(cell);
                        if !last {
                            text.push_str(&" ".repeat(pad));
                        }
                    }
                }
                if !last {
                    text.push_str("  ");
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns() {
        let mut t = Table::new(&[("Pool", Align::Left), ("Pages", Align::Right), ("Note", Align::Left)]);
        t.row(["system", "512", "2 MiB pages"]);
        t.row(["node 0", "0", ""]);
        assert_eq!(
            t.render(),
            "Pool    Pages  Note\n\
             system    512  2 MiB pages\n\
             node 0      0\n"
        );
    }

    #[test]
    fn short_rows_are_padded() {
        let mut t = Table::new(&[("A", Align::Left), ("B", Align::Left)]);
        t.row(["only"]);
        assert_eq!(t.render(), "A     B\nonly\n");
    }
}
