//! Delta debugging (Zeller and Hildebrandt's `ddmin`): the smallest set of
//! changes that still shows a failure, found by trying halves, then
//! quarters, and so on, and their complements. The result is 1-minimal:
//! leaving out any one of its changes loses the failure.

/// A 1-minimal subset of `changes` for which `shows` holds, given that it
/// holds of them all. Subsets keep the changes' order.
pub fn ddmin<T: Clone>(changes: Vec<T>, shows: &mut dyn FnMut(&[T]) -> bool) -> Vec<T> {
    if shows(&[]) {
        return Vec::new();
    }
    let mut current = changes;
    let mut parts = 2;
    while current.len() >= 2 {
        let chunks = split(&current, parts);
        if let Some(chunk) = chunks.iter().find(|c| shows(c)) {
            current = chunk.clone();
            parts = 2;
            continue;
        }
        let complement = |skip: usize| -> Vec<T> {
            chunks
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != skip)
                .flat_map(|(_, c)| c.iter().cloned())
                .collect()
        };
        if let Some(rest) = (0..chunks.len()).map(complement).find(|r| shows(r)) {
            current = rest;
            parts = (parts - 1).max(2);
            continue;
        }
        if parts >= current.len() {
            break;
        }
        parts = (parts * 2).min(current.len());
    }
    current
}

/// `items` in `parts` runs of nearly equal length.
fn split<T: Clone>(items: &[T], parts: usize) -> Vec<Vec<T>> {
    let mut out = Vec::with_capacity(parts);
    let mut start = 0;
    for i in 0..parts {
        let end = start + (items.len() - start) / (parts - i);
        out.push(items[start..end].to_vec());
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::ddmin;

    #[test]
    fn finds_the_two_changes_that_matter() {
        let changes: Vec<u32> = (0..20).collect();
        let mut tried = 0;
        let found = ddmin(changes, &mut |c: &[u32]| {
            tried += 1;
            c.contains(&3) && c.contains(&17)
        });
        assert_eq!(found, vec![3, 17]);
        assert!(tried < 60, "{tried} tries");
    }

    #[test]
    fn nothing_when_nothing_is_needed() {
        assert!(ddmin(vec![1, 2, 3], &mut |_: &[i32]| true).is_empty());
    }
}
