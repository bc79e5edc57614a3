//! "I cannot see" means "stop", never "they are dead": a tick first checks
//! that it can see what it judges by. The wall clock must not have jumped
//! against the monotonic clock by more than a second since the last tick
//! (a heartbeat's age is read on the wall clock), and this host's `/proc`
//! must answer (a process table that cannot be read proves nothing dead).
//! A registry or lease store that cannot be read fails the plan itself.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

/// The largest jump of the wall clock against the monotonic one tolerated.
const JUMP: Duration = Duration::from_secs(1);

/// The clocks as the last tick read them.
#[derive(Default)]
pub struct Sight {
    last: Option<(Instant, SystemTime)>,
}

impl Sight {
    /// Why this tick cannot see, if it cannot.
    pub fn blind(&mut self, proc_root: &Path) -> Option<String> {
        let now = (Instant::now(), SystemTime::now());
        let last = self.last.replace(now);
        if let Some((mono, wall)) = last {
            let mono = now.0.duration_since(mono).as_secs_f64();
            let wall = match now.1.duration_since(wall) {
                Ok(d) => d.as_secs_f64(),
                Err(e) => -e.duration().as_secs_f64(),
            };
            if (wall - mono).abs() > JUMP.as_secs_f64() {
                return Some(format!(
                    "the wall clock moved {wall:.3} s while the monotonic clock moved {mono:.3} s \
                     since the last tick; heartbeat ages cannot be trusted on this tick"
                ));
            }
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
