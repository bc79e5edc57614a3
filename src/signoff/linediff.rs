//! A line diff of two texts (a longest common subsequence of their lines),
//! for the page's source view of a file that differs from the base.

/// One line of the merged view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// In both: the old line's number and the new one's (1-based).
    Same(usize, usize),
    /// Only in the old text (removed): its line number there.
    Removed(usize),
    /// Only in the new text (added): its line number there.
    Added(usize),
}

/// The old and new texts' lines merged: common lines once, removed lines
/// before the added lines that replace them.
pub fn diff(old: &str, new: &str) -> Vec<Op> {
    let (a, b): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let prefix = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let suffix = a[prefix..]
        .iter()
        .rev()
        .zip(b[prefix..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (mid_a, mid_b) = (&a[prefix..a.len() - suffix], &b[prefix..b.len() - suffix]);
    let mut out: Vec<Op> = (1..=prefix).map(|n| Op::Same(n, n)).collect();
    for op in middle(mid_a, mid_b) {
        out.push(match op {
            Op::Same(i, j) => Op::Same(prefix + i, prefix + j),
            Op::Removed(i) => Op::Removed(prefix + i),
            Op::Added(j) => Op::Added(prefix + j),
        });
    }
    let (tail_a, tail_b) = (a.len() - suffix, b.len() - suffix);
    out.extend((1..=suffix).map(|k| Op::Same(tail_a + k, tail_b + k)));
    out
}

/// The diff of two runs of lines by dynamic programming over their
/// longest common subsequence (positions 1-based within the runs).
fn middle(a: &[&str], b: &[&str]) -> Vec<Op> {
    let (n, m) = (a.len(), b.len());
    // lcs[i][j]: the longest common subsequence of a[i..] and b[j..].
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::with_capacity(n + m);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            out.push(Op::Same(i + 1, j + 1));
            (i, j) = (i + 1, j + 1);
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            out.push(Op::Removed(i + 1));
            i += 1;
        } else {
            out.push(Op::Added(j + 1));
            j += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{diff, Op};

    #[test]
    fn a_removed_and_an_added_line() {
        let old = "a\nb\nc\nd\n";
        let new = "a\nc\nx\nd\n";
        assert_eq!(
            diff(old, new),
            vec![
                Op::Same(1, 1),
                Op::Removed(2),
                Op::Same(3, 2),
                Op::Added(3),
                Op::Same(4, 4)
            ]
        );
    }
}
