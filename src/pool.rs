//! The worker pool: map over a slice on every core, keeping order. Used by
//! observation, judging, tokens and rendering; it knows nothing of them, so
//! every stage may use it without importing another stage.

/// Map `f` over `items` on every core, keeping order. The items are cut
/// into blocks that the cores take in turn as they finish the last, so a
/// core that shares its time with other work (or meets slower items) does
/// fewer, and none waits long for another at the end. Each block's results
/// go straight into their part of the one output vector, so a large result
/// never exists twice (the parts and their concatenation).
pub fn par_map<T: Sync, U: Send>(items: &[T], f: impl Fn(&T) -> U + Sync) -> Vec<U> {
    par_map_from(1024, 64, items, f)
}

/// [`par_map`] for items that each cost much more than starting a thread
/// (a Cedar evaluation): shared out from two items on, one at a time.
pub fn par_map_costly<T: Sync, U: Send>(items: &[T], f: impl Fn(&T) -> U + Sync) -> Vec<U> {
    par_map_from(2, 1, items, f)
}

/// [`par_map`] on every core once there are `least` items, in blocks of at
/// least `block` items.
fn par_map_from<T: Sync, U: Send>(
    least: usize,
    block: usize,
    items: &[T],
    f: impl Fn(&T) -> U + Sync,
) -> Vec<U> {
    let workers = workers();
    if items.len() < least.max(2) || workers == 1 {
        return items.iter().map(f).collect();
    }
    let per = block_len(items.len(), workers, block);
    let mut out: Vec<U> = Vec::with_capacity(items.len());
    let f = &f;
    {
        let slots = &mut out.spare_capacity_mut()[..items.len()];
        let blocks = std::sync::Mutex::new(items.chunks(per).zip(slots.chunks_mut(per)));
        let blocks = &blocks;
        std::thread::scope(|scope| {
            for _ in 0..workers {
                scope.spawn(move || loop {
                    // The lock is held only to take a block, never while
                    // mapping, so it cannot be poisoned; were it anyway,
                    // its iterator is still whole, and every block is
                    // still taken (the SAFETY note below needs that).
                    let next = blocks.lock().unwrap_or_else(|p| p.into_inner()).next();
                    let Some((chunk, slots)) = next else {
                        return;
                    };
                    for (item, slot) in chunk.iter().zip(slots) {
                        slot.write(f(item));
                    }
                });
            }
        });
    }
    // SAFETY: the blocks of `items` and of the slots pair up one to one and
    // cover all `items.len()` slots; each block is taken by exactly one
    // worker, which writes every slot of it. `scope` returns only after
    // every worker has finished, which is after the block iterator ran out,
    // and panics (before this line) if any of them did, so here every slot
    // holds a value. (On a panic the values written are leaked, never read.)
    unsafe { out.set_len(items.len()) };
    out
}

/// How many items a block holds: about eight blocks per worker, so the
/// last block is a small share of the work, and at least `least`, so that
/// taking a block costs nothing beside its items.
fn block_len(items: usize, workers: usize, least: usize) -> usize {
    items.div_ceil(workers * 8).max(least)
}

/// How many threads the pool uses: one per core, at most eight.
fn workers() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 8)
}

/// Split `items` into chunks, map each chunk with `f` on every core, and
/// concatenate the results in order. As in [`par_map`], the cores take the
/// chunks in turn (a few per core, each a batch large enough for `f` to
/// share its setup across many items).
pub fn par_chunks<T: Sync, U: Send>(items: &[T], f: impl Fn(&[T]) -> Vec<U> + Sync) -> Vec<U> {
    let workers = workers();
    if items.len() < 1024 || workers == 1 {
        return f(items);
    }
    let per = items.len().div_ceil(workers * 4);
    let f = &f;
    let chunks = std::sync::Mutex::new(items.chunks(per).enumerate());
    let chunks = &chunks;
    let mut parts: Vec<(usize, Vec<U>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(move || {
                    let mut done = Vec::new();
                    // The lock is held only to take a chunk, never while
                    // mapping: the guard is a temporary of this statement,
                    // gone at its end. (Taken in a `while let` condition,
                    // it would live through the loop's body and every
                    // chunk would run one after another.) A panic in `f`
                    // is raised below.
                    loop {
                        let next = chunks.lock().unwrap_or_else(|p| p.into_inner()).next();
                        let Some((at, chunk)) = next else {
                            return done;
                        };
                        done.push((at, f(chunk)));
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    parts.sort_unstable_by_key(|(at, _)| *at);
    // One allocation of the final size, not a doubling series of copies of
    // a large result.
    let mut out = Vec::with_capacity(parts.iter().map(|(_, p)| p.len()).sum());
    for (_, part) in parts {
        out.extend(part);
    }
    out
}

/// Run `beside` on a thread of its own while `here` runs on this one, and
/// return both results (a panic in either is raised here).
pub fn join<A: Send, B>(beside: impl FnOnce() -> A + Send, here: impl FnOnce() -> B) -> (A, B) {
    std::thread::scope(|scope| {
        let other = scope.spawn(beside);
        let mine = here();
        let theirs = other
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (theirs, mine)
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
    let workers = workers().min(items.len());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn par_map_keeps_order_and_every_value() {
        for n in [0, 1, 2, 3, 17, 1023, 1024, 1025, 4097, 100_003] {
            let items: Vec<usize> = (0..n).collect();
            let expected: Vec<String> = items.iter().map(|i| format!("v{i}")).collect();
            let mapped = par_map(&items, |i| format!("v{i}"));
            assert_eq!(mapped, expected, "{n} items");
            let mapped = par_map_costly(&items, |i| format!("v{i}"));
            assert_eq!(mapped, expected, "{n} costly items");
        }
    }

    #[test]
    fn par_chunks_keeps_order_and_every_value() {
        for n in [0, 1, 1023, 1024, 1025, 4097, 100_003] {
            let items: Vec<usize> = (0..n).collect();
            let mapped = par_chunks(&items, |chunk| chunk.iter().map(|i| i * 2).collect());
            let expected: Vec<usize> = items.iter().map(|i| i * 2).collect();
            assert_eq!(mapped, expected, "{n} items");
        }
    }

    /// Every map of the pool runs its blocks on two cores at once: each
    /// block waits (up to a few seconds) for another block to be running
    /// beside it. Were the blocks run one after another (a lock held while
    /// mapping, as `par_chunks` once did), no block would ever see another.
    #[test]
    fn blocks_run_side_by_side() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        if workers() < 2 {
            eprintln!("one core: nothing runs side by side here");
            return;
        }
        let meet = |running: &AtomicUsize, met: &AtomicUsize| {
            running.fetch_add(1, Ordering::SeqCst);
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            // Once two blocks have met, the rest need not wait.
            while std::time::Instant::now() < until && met.load(Ordering::SeqCst) == 0 {
                if running.load(Ordering::SeqCst) >= 2 {
                    met.fetch_add(1, Ordering::SeqCst);
                    break;
                }
                std::thread::yield_now();
            }
            running.fetch_sub(1, Ordering::SeqCst);
        };
        let items: Vec<usize> = (0..4096).collect();
        let (running, met) = (AtomicUsize::new(0), AtomicUsize::new(0));
        par_chunks(&items, |chunk| {
            meet(&running, &met);
            chunk.to_vec()
        });
        assert!(
            met.load(Ordering::SeqCst) > 0,
            "par_chunks ran its chunks one at a time"
        );
        let (running, met) = (AtomicUsize::new(0), AtomicUsize::new(0));
        par_map_costly(&items[..4], |&i| {
            meet(&running, &met);
            i
        });
        assert!(
            met.load(Ordering::SeqCst) > 0,
            "par_map ran its blocks one at a time"
        );
    }

    #[test]
    fn a_panicking_map_panics_the_caller() {
        let items: Vec<usize> = (0..10_000).collect();
        let result = std::panic::catch_unwind(|| {
            par_map(&items, |&i| {
                assert!(i != 9_000, "boom");
                vec![i; 3]
            })
        });
        assert!(result.is_err());
    }
}
