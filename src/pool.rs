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
        let parts: Vec<Vec<U>> = handles
            .into_iter()
            .map(|h| h.join().expect("worker thread panicked"))
            .collect();
        // One allocation of the final size, not a doubling series of
        // copies of a large result.
        let mut out = Vec::with_capacity(parts.iter().map(Vec::len).sum());
        for part in parts {
            out.extend(part);
        }
        out
    })
}

/// Map `f` over `items` on every core and hand the results to `consume`
/// in order, as they come: worker `w` maps items `w`, `w + n`, … and waits
/// while its last result is unconsumed, so at most about two results per
/// core exist at once (for streams too large to hold mapped in full).
pub fn par_map_ordered<T: Sync, U: Send>(
    items: &[T],
    f: impl Fn(&T) -> U + Sync,
    mut consume: impl FnMut(U),
) {
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 8)
        .min(items.len());
    if workers <= 1 {
        items.iter().map(&f).for_each(consume);
        return;
    }
    let f = &f;
    std::thread::scope(|scope| {
        let receivers: Vec<std::sync::mpsc::Receiver<U>> = (0..workers)
            .map(|w| {
                let (send, receive) = std::sync::mpsc::sync_channel(1);
                scope.spawn(move || {
                    for item in items.iter().skip(w).step_by(workers) {
                        if send.send(f(item)).is_err() {
                            return;
                        }
                    }
                });
                receive
            })
            .collect();
        for i in 0..items.len() {
            let result = receivers[i % workers]
                .recv()
                .expect("worker thread panicked");
            consume(result);
        }
    });
}

/// A plan of a large registry allocates and frees hundreds of megabytes,
/// much of it on the pool's threads. glibc keeps freed memory in per-thread
/// arenas, where the next thread's allocations may not reuse it: a server
/// would look as if it grew with every call, and apply's post-apply read
/// would stack on the freed plan. Hand what is free back to the kernel.
pub fn give_back_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap pages; it has no
    // preconditions and touches no memory the program still owns.
    unsafe {
        nix::libc::malloc_trim(0);
    }
}

/// Fewer malloc arenas for a server whose calls run on whichever blocking
/// thread is free (glibc's default is eight per core).
pub fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt is called once at start, before any other thread
    // exists; it only changes the allocator's tuning.
    unsafe {
        nix::libc::mallopt(nix::libc::M_ARENA_MAX, 2);
    }
}
