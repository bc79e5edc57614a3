//! "I cannot see" means "stop", never "they are dead": a tick first checks
//! that it can see what it judges by. The wall clock must not have jumped
//! against the monotonic clock by more than a second since the last tick
//! (a heartbeat's age is read on the wall clock), nor while the tick runs
//! (asked again after its plan and by its apply before COMMIT:
//! [`Sight::moved`]), and this host's `/proc`
//! must answer (a process table that cannot be read proves nothing dead).
//! The registry's server must be the one the last tick read, before the
//! plan and after it: a failover (or a restart) since makes this tick
//! retire nothing, and the next one judges afresh on the new server. A registry or lease store that cannot
//! be read fails the plan itself.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

/// The largest jump of the wall clock against the monotonic one tolerated.
const JUMP: Duration = Duration::from_secs(1);

/// The clocks as the last tick read them.
#[derive(Default)]
pub struct Sight {
    last: Option<(Instant, SystemTime)>,
    /// The registry's server as the last tick found it.
    server: Option<String>,
}

impl Sight {
    /// Why this tick cannot see, if it cannot.
    pub fn blind(&mut self, proc_root: &Path) -> Option<String> {
        self.blind_at((Instant::now(), SystemTime::now()), proc_root)
    }

    /// [`Sight::blind`] with the clocks read at `now`.
    fn blind_at(&mut self, now: (Instant, SystemTime), proc_root: &Path) -> Option<String> {
        let last = self.last.replace(now);
        if let Some(why) = last.and_then(|last| jumped(last, now, "the last tick")) {
            return Some(why);
        }
        for file in ["self/stat", "sys/kernel/random/boot_id"] {
            let path = proc_root.join(file);
            if let Err(e) = std::fs::read(&path) {
                return Some(format!(
                    "{} cannot be read ({e}); this host's processes cannot be seen",
                    path.display()
                ));
            }
        }
        None
    }
}

impl Sight {
    /// Why this tick cannot trust what it read since it looked
    /// ([`Sight::blind`]): the wall clock jumped against the monotonic
    /// clock meanwhile (its plan may have read heartbeat ages on either).
    pub fn moved(&self) -> Option<String> {
        jumped(
            self.last?,
            (Instant::now(), SystemTime::now()),
            "this tick began",
        )
    }

    /// Take the clocks as they are now for the last tick's: after a tick
    /// that found a jump under way, the next judges afresh from here.
    pub fn look_again(&mut self) {
        self.last = Some((Instant::now(), SystemTime::now()));
    }

    /// Why this tick cannot see, if the registry's server (`now`, as the
    /// store states it) is not the one the last tick read.
    pub fn server_changed(&mut self, now: Option<String>) -> Option<String> {
        let now = now?;
        let was = self.server.replace(now.clone())?;
        (was != now).then(|| {
            format!(
                "the registry's server changed since it was last asked (a failover or a restart: \
                 {was:?}, now {now:?}); what the last tick saw may not be there"
            )
        })
    }
}

/// How the wall clock moved against the monotonic clock from `then` to
/// `now`, when by more than [`JUMP`].
fn jumped(then: (Instant, SystemTime), now: (Instant, SystemTime), since: &str) -> Option<String> {
    let mono = now.0.duration_since(then.0).as_secs_f64();
    let wall = match now.1.duration_since(then.1) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    };
    ((wall - mono).abs() > JUMP.as_secs_f64()).then(|| {
        format!(
            "the wall clock moved {wall:.3} s while the monotonic clock moved {mono:.3} s \
             since {since}; heartbeat ages cannot be trusted on this tick"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wall_clock_jump_against_the_monotonic_clock_makes_a_tick_blind() {
        let proc_root = Path::new("/proc");
        let (i0, w0) = (Instant::now(), SystemTime::now());
        let mut sight = Sight::default();
        assert!(sight.blind_at((i0, w0), proc_root).is_none());
        let steady = (
            i0 + Duration::from_secs(30),
            w0 + Duration::from_millis(30_400),
        );
        assert!(sight.blind_at(steady, proc_root).is_none());
        let jumped = (i0 + Duration::from_secs(60), w0 + Duration::from_secs(95));
        assert!(sight
            .blind_at(jumped, proc_root)
            .unwrap()
            .contains("wall clock"));
        let back = (i0 + Duration::from_secs(61), w0 + Duration::from_secs(90));
        assert!(sight.blind_at(back, proc_root).is_some());
    }

    #[test]
    fn a_new_server_makes_one_tick_blind() {
        let mut sight = Sight::default();
        assert!(sight.server_changed(Some("a".into())).is_none());
        assert!(sight.server_changed(Some("a".into())).is_none());
        assert!(sight.server_changed(None).is_none());
        assert!(sight
            .server_changed(Some("b".into()))
            .unwrap()
            .contains("failover"));
        assert!(sight.server_changed(Some("b".into())).is_none());
    }

    #[test]
    fn a_proc_that_cannot_be_read_makes_a_tick_blind() {
        let empty = tempfile::tempdir().unwrap();
        let why = Sight::default().blind(empty.path()).unwrap();
        assert!(why.contains("self/stat"), "{why}");
    }
}
