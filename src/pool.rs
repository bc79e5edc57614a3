//! The worker pool: map over a slice on every core, keeping order. Used by
//! observation, judging, tokens and rendering; it knows nothing of them, so
//! every stage may use it without importing another stage.

/// Map `f` over `items` on every core, keeping order.
pub fn par_map<T: Sync, U: Send>(items: &[T], f: impl Fn(&T) -> U + Sync) -> Vec<U> {
    par_chunks(items, |chunk| chunk.iter().map(&f).collect())
}

/// Split `items` into one chunk per core, map each chunk with `f`, and
/// concatenate the results in order.
pub fn par_chunks<T: Sync, U: Send>(items: &[T], f: impl Fn(&[T]) -> Vec<U> + Sync) -> Vec<U> {
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 8);
    if items.len() < 1024 || workers == 1 {
        return f(items);
    }
    let per = items.len().div_ceil(workers);
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .chunks(per)
            .map(|chunk| scope.spawn(move || f(chunk)))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("worker thread panicked"))
            .collect()
    })
}
