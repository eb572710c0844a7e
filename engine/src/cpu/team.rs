//! `with_team`, `for_each` and `map`: the parallel loops of a forward on one team of the thread
//! pool's workers, woken once per forward instead of once per loop. A CPU forward runs about nine
//! parallel loops per layer (several hundred per forward); as rayon loops each one hands its work
//! to the other workers through their queues and splits it as they steal (in a profile of a one-row
//! forward on two cores, each worker spent about a fifth of its time scheduling, stealing and
//! waiting). Inside `with_team` the calling thread (the leader: the engine's own thread, or a pool
//! worker) has recruited the pool's other workers once, as helpers that spin between loops. Each
//! loop's tasks are dealt out in contiguous runs, one per member, each run in its own atomic word
//! on its own cache line: a member claims its own run's tasks without touching another core's line,
//! then takes what is left of the others' runs. The leader never waits for a helper to arrive, only
//! for the tasks helpers claimed to finish: a helper whose worker is busy elsewhere (another
//! engine's forward) simply never joins, and the leader takes its run. Outside a team, `for_each`
//! and `map` are rayon loops. Which thread runs a task never changes its result. As a forward ends,
//! one worker `linger`s, polling for the next forward's work a little while before it lets its core
//! idle.

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use rayon::prelude::*;

/// A loop's job as the team reads it: the leader's `&dyn Fn(usize)`, behind a thin pointer.
type Job<'a> = &'a (dyn Fn(usize) + Sync);

/// Spins of an idle helper (or a leader waiting on helpers) between which it yields its core.
const SPINS: u32 = 1 << 12;

/// Past `SPINS`, how many of an idle helper's waits pass between its looks for pool work.
const POOL_WORK_EVERY: u32 = 64;

/// One member's run of the current loop, `next << 32 | end`, alone on its cache line.
#[repr(align(128))]
struct Run(AtomicU64);

/// What the leader and its helpers share.
struct Team {
    /// One run per member; the leader's is the first.
    runs: Vec<Run>,
    /// The current loop's job: points at a `Job` on the leader's stack, valid while the loop
    /// has unclaimed tasks (a helper reads it only after claiming one).
    job: AtomicPtr<()>,
    /// Tasks of the current loop finished by helpers.
    finished: AtomicU32,
    /// Whether a helper's task panicked in the current loop.
    panicked: AtomicBool,
    /// Set when the forward is over: helpers leave.
    done: AtomicBool,
}

impl Team {
    fn new(members: usize) -> Self {
        Self {
            runs: (0..members.max(1))
                .map(|_| Run(AtomicU64::new(0)))
                .collect(),
            job: AtomicPtr::new(std::ptr::null_mut()),
            finished: AtomicU32::new(0),
            panicked: AtomicBool::new(false),
            done: AtomicBool::new(false),
        }
    }

    /// Claims the next task of `run`: its index, or `None` when all of the run is claimed.
    /// A successful claim is of the loop in progress (a run holds unclaimed tasks only
    /// between the leader's publishing of a loop and its end).
    fn claim(run: &Run) -> Option<usize> {
        let mut word = run.0.load(Ordering::Acquire);
        loop {
            let (next, end) = (word >> 32, word & u64::from(u32::MAX));
            if next >= end {
                return None;
            }
            match run.0.compare_exchange_weak(
                word,
                word + (1 << 32),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(next as usize),
                Err(now) => word = now,
            }
        }
    }

    /// Claims a task: from run `own` first, then from the others'.
    fn claim_any(&self, own: usize) -> Option<usize> {
        let members = self.runs.len();
        (0..members).find_map(|i| Self::claim(&self.runs[(own + i) % members]))
    }

    /// A helper's life as member `own`: claim and run tasks of each loop the leader
    /// publishes, until done. While idle it watches its own run only (the others' lines
    /// stay with their owners); once it has worked in a loop it takes from the others' too.
    fn help(&self, own: usize) {
        let mut idle = 0u32;
        while !self.done.load(Ordering::Acquire) {
            let Some(first) = Self::claim(&self.runs[own]) else {
                idle = idle.saturating_add(1);
                if idle < SPINS {
                    std::hint::spin_loop();
                } else if !idle.is_multiple_of(POOL_WORK_EVERY)
                    || !matches!(rayon::yield_now(), Some(rayon::Yield::Executed))
                {
                    // Idle a while: now and then run pool work waiting meanwhile (a leader
                    // outside the pool may wait on a rayon call of its own that only a
                    // worker can run, with every worker some team's helper), else give the
                    // core away.
                    std::thread::yield_now();
                }
                continue;
            };
            idle = 0;
            // Work until nothing is left anywhere, then report the count once.
            let mut ran = 0u32;
            let mut next = Some(first);
            while let Some(task) = next {
                // SAFETY: a claimed task is unfinished, so the leader is still inside the
                // loop that published it (it waits for every claimed task), and the job it
                // stored before publishing (seen through the claim's acquire) is alive on
                // its stack.
                let job = unsafe { *(self.job.load(Ordering::Relaxed) as *const Job<'_>) };
                if catch_unwind(AssertUnwindSafe(|| job(task))).is_err() {
                    self.panicked.store(true, Ordering::Relaxed);
                }
                ran += 1;
                next = self.claim_any(own);
            }
            self.finished.fetch_add(ran, Ordering::Release);
        }
    }

    /// The leader's loop: deals `tasks` tasks of `job` out in runs, runs those it claims, and
    /// returns once the helpers' are finished too. A task's panic is raised here, after every
    /// task has finished.
    fn run(&self, tasks: usize, job: Job<'_>) {
        self.job
            .store(&job as *const Job<'_> as *mut (), Ordering::Relaxed);
        self.finished.store(0, Ordering::Relaxed);
        self.panicked.store(false, Ordering::Relaxed);
        let members = self.runs.len();
        // The helpers' runs first: they start while the leader deals its own.
        for (i, run) in self.runs.iter().enumerate().rev() {
            let (start, end) = (i * tasks / members, (i + 1) * tasks / members);
            run.0
                .store((start as u64) << 32 | end as u64, Ordering::Release);
        }
        let mut mine = 0u32;
        let mut failure = None;
        while let Some(task) = self.claim_any(0) {
            mine += 1;
            if let Err(e) = catch_unwind(AssertUnwindSafe(|| job(task))) {
                failure.get_or_insert(e);
            }
        }
        let theirs = tasks as u32 - mine;
        let mut spins = 0u32;
        while self.finished.load(Ordering::Acquire) < theirs {
            spins = spins.saturating_add(1);
            pause(spins);
        }
        if let Some(e) = failure {
            resume_unwind(e);
        }
        if self.panicked.load(Ordering::Relaxed) {
            panic!("a task of a parallel loop panicked on a helper thread");
        }
    }
}

/// One step of a wait: a spin, or after `SPINS` of them a yield of the core.
fn pause(spins: u32) {
    if spins < SPINS {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

thread_local! {
    /// The team this thread leads, while inside `with_team` and not inside one of its loops.
    static LEADING: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
    /// Whether this thread leads or helps a team now. Such a thread never starts helping
    /// (another) team: a helper blocks its thread until its team's forward ends, and a thread
    /// that blocked inside its own team's work would never let that forward end.
    static IN_TEAM: Cell<bool> = const { Cell::new(false) };
}

/// Ends a team when `with_team`'s body returns or unwinds: helpers leave, the thread leads
/// no more.
struct Disband(Arc<Team>);

impl Drop for Disband {
    fn drop(&mut self) {
        self.0.done.store(true, Ordering::Release);
        LEADING.with(|l| l.set(std::ptr::null()));
        IN_TEAM.with(|t| t.set(false));
    }
}

/// Marks this thread as a helper while it helps.
struct Helping;

impl Helping {
    fn start() -> Self {
        IN_TEAM.with(|t| t.set(true));
        Self
    }
}

impl Drop for Helping {
    fn drop(&mut self) {
        IN_TEAM.with(|t| t.set(false));
    }
}

/// Runs `body` with this thread leading a team of the pool's other workers (all of them but
/// one when this thread is outside the pool, so that the team has one member per core): every
/// `for_each` and `map` it calls runs on the team. Called by a thread that already leads or
/// helps a team, just runs `body` (its loops run as that thread's would).
pub fn with_team<R>(body: impl FnOnce() -> R) -> R {
    if IN_TEAM.with(|t| t.get()) {
        return body();
    }
    let members = rayon::current_num_threads();
    let team = Arc::new(Team::new(members));
    for own in 1..members {
        let team = team.clone();
        rayon::spawn(move || {
            // A worker inside a team (this one's leader among them, running queued work
            // inside a rayon call of the body) leaves this team to the others.
            if !IN_TEAM.with(|t| t.get()) {
                let _helping = Helping::start();
                team.help(own);
            }
        });
    }
    IN_TEAM.with(|t| t.set(true));
    LEADING.with(|l| l.set(&*team));
    let _disband = Disband(team);
    body()
}

/// How long a pool worker keeps polling for work after a forward before it lets its core
/// idle.
const LINGER: std::time::Duration = std::time::Duration::from_millis(2);

/// Keeps one pool worker polling for the next piece of pool work (the next forward, or its
/// helpers' jobs) for [`LINGER`], yielding its core between polls, instead of going to sleep
/// at once. Called as a forward ends. Between two forwards the engine thread plans and
/// samples for a fraction of a millisecond; a worker asleep that long may let its core idle,
/// and on a virtual machine a core that idles is handed back to the host, which can take
/// milliseconds to give it back: the next forward's helper then joins late, and the leader
/// works alone meanwhile.
pub fn linger() {
    linger_for(LINGER);
}

/// [`linger`] for `limit`.
fn linger_for(limit: std::time::Duration) {
    rayon::spawn(move || {
        let started = std::time::Instant::now();
        while started.elapsed() < limit {
            match rayon::yield_now() {
                Some(rayon::Yield::Idle) => std::thread::yield_now(),
                // Work ran (a forward lingers again as it ends), or this is no pool thread.
                Some(rayon::Yield::Executed) | None => return,
            }
        }
    });
}

/// Runs `f(i)` for every `i` in `0..tasks`, spread over the team this thread leads, or over
/// the rayon pool outside a team. Inside a task of a team's loop (on its leader or a helper)
/// the tasks run here in turn: the team's other members are busy with the outer loop, and a
/// leader outside the pool would otherwise hand them to an idle worker and sleep.
pub fn for_each(tasks: usize, f: impl Fn(usize) + Sync) {
    let leading = LEADING.with(|l| l.get());
    if leading.is_null() || tasks > u32::MAX as usize {
        if IN_TEAM.with(|t| t.get()) {
            (0..tasks).for_each(&f);
        } else {
            (0..tasks).into_par_iter().for_each(&f);
        }
        return;
    }
    // Loops inside this loop's tasks (on this thread) run in turn on their task's thread.
    LEADING.with(|l| l.set(std::ptr::null()));
    struct Restore(*const Team);
    impl Drop for Restore {
        fn drop(&mut self) {
            LEADING.with(|l| l.set(self.0));
        }
    }
    let _restore = Restore(leading);
    // SAFETY: `leading` was set by `with_team` on this thread from a team that `with_team`
    // keeps alive until it clears `LEADING` on the way out.
    unsafe { &*leading }.run(tasks, &f);
}

/// `f(i)` for every `i` in `0..tasks`, in order, computed as `for_each` spreads work.
pub fn map<T: Send>(tasks: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let mut out: Vec<Option<T>> = (0..tasks).map(|_| None).collect();
    let slots = Slots(out.as_mut_ptr());
    for_each(tasks, |i| {
        let value = f(i);
        // SAFETY: task `i` alone writes slot `i`, which lies inside `out`, and `out`
        // outlives the loop.
        unsafe { *slots.at(i) = Some(value) };
    });
    out.into_iter()
        .map(|v| v.expect("invariant: every task of a finished loop wrote its slot"))
        .collect()
}

/// `map`'s results, written one slot per task.
struct Slots<T>(*mut Option<T>);

// SAFETY: tasks write disjoint slots, and values of `T: Send` move to the thread that reads
// them after the loop.
unsafe impl<T: Send> Sync for Slots<T> {}

impl<T> Slots<T> {
    /// Slot `i`'s address (taking `&self` keeps the closure capturing the whole wrapper).
    fn at(&self, i: usize) -> *mut Option<T> {
        // SAFETY: callers pass indices inside the vector `self.0` points into.
        unsafe { self.0.add(i) }
    }
}

/// A buffer whose disjoint runs the tasks of one loop write, each its own.
pub struct Disjoint<T>(*mut T);

// SAFETY: tasks reach only disjoint runs (the contract of `run`), and values of `T: Send`
// may be written from any thread.
unsafe impl<T: Send> Sync for Disjoint<T> {}
// SAFETY: as for `Sync`: the handle only carries the address.
unsafe impl<T: Send> Send for Disjoint<T> {}

impl<T> Clone for Disjoint<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Disjoint<T> {}

impl<T> Disjoint<T> {
    /// Shares `buffer`'s values between the tasks of a loop that outlives no borrow of it.
    pub fn new(buffer: &mut [T]) -> Self {
        Self(buffer.as_mut_ptr())
    }

    /// The `len` values from `at`.
    ///
    /// # Safety
    /// They must lie inside the buffer, the buffer must still be borrowed by the loop's
    /// caller, and no other live reference may reach them.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn run(&self, at: usize, len: usize) -> &mut [T] {
        std::slice::from_raw_parts_mut(self.0.add(at), len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool")
    }

    #[test]
    fn every_task_of_every_loop_runs_once() {
        for threads in [1, 2, 4] {
            pool(threads).install(|| {
                with_team(|| {
                    for tasks in [0usize, 1, 2, 3, 17, 300] {
                        let counts: Vec<AtomicUsize> =
                            (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                        for_each(tasks, |i| {
                            counts[i].fetch_add(1, Ordering::Relaxed);
                        });
                        assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
                        let squares = map(tasks, |i| i * i);
                        assert_eq!(squares, (0..tasks).map(|i| i * i).collect::<Vec<_>>());
                    }
                })
            });
        }
    }

    #[test]
    fn a_lingering_worker_gives_way_to_pool_work() {
        // One worker, lingering far longer than the test may take: work reaching the pool
        // meanwhile runs on it at once, and the linger ends there.
        let pool = pool(1);
        let limit = std::time::Duration::from_secs(30);
        for _ in 0..20 {
            pool.install(|| linger_for(limit));
            let started = std::time::Instant::now();
            assert_eq!(
                pool.install(|| (0..100u32).into_par_iter().sum::<u32>()),
                4950
            );
            assert!(started.elapsed() < limit / 10, "{:?}", started.elapsed());
        }
    }

    #[test]
    fn helpers_take_tasks_when_they_are_free() {
        let threads = pool(2).install(|| {
            with_team(|| {
                let mut seen = std::collections::HashSet::new();
                // Tasks long enough that the helper, once woken, takes some.
                for _ in 0..200 {
                    let ids = map(8, |_| {
                        std::thread::sleep(std::time::Duration::from_micros(50));
                        std::thread::current().id()
                    });
                    seen.extend(ids);
                    if seen.len() == 2 {
                        break;
                    }
                }
                seen.len()
            })
        });
        assert_eq!(threads, 2);
    }

    #[test]
    fn loops_in_tasks_and_teams_in_teams_still_finish() {
        pool(2).install(|| {
            with_team(|| {
                let total = AtomicUsize::new(0);
                for_each(4, |_| {
                    // A rayon loop inside a task, and a team inside the team.
                    for_each(5, |_| {
                        total.fetch_add(1, Ordering::Relaxed);
                    });
                    with_team(|| {
                        (0..3).into_par_iter().for_each(|_| {
                            total.fetch_add(1, Ordering::Relaxed);
                        })
                    });
                });
                assert_eq!(total.load(Ordering::Relaxed), 4 * 8);
            })
        });
    }

    #[test]
    fn threads_outside_the_pool_lead_teams_and_run_inner_loops_themselves() {
        // Engines' threads lead their forwards' teams of the global pool's workers, several
        // at once; a loop inside a task the leader took runs on the leader.
        let engines: Vec<_> = (0..3usize)
            .map(|engine| {
                std::thread::spawn(move || {
                    let leader = std::thread::current().id();
                    with_team(|| {
                        let mut led = 0usize;
                        for _ in 0..20 {
                            let inner = map(16, |_| {
                                let outer = std::thread::current().id();
                                let ids = map(4, |_| std::thread::current().id());
                                (outer, ids.iter().all(|&id| id == outer))
                            });
                            assert!(inner.iter().all(|&(_, here)| here), "{inner:?}");
                            led += inner.iter().filter(|(id, _)| *id == leader).count();
                        }
                        let sum: usize = map(100, |i| i + engine).iter().sum();
                        (led, sum)
                    })
                })
            })
            .collect();
        for (engine, handle) in engines.into_iter().enumerate() {
            let (led, sum) = handle.join().expect("engine thread");
            assert!(led > 0, "the leader took no task");
            assert_eq!(sum, 4950 + 100 * engine);
        }
    }

    #[test]
    fn leaders_outside_the_pool_may_wait_on_rayon_calls_of_their_own() {
        // As many leaders as workers, each waiting inside its team on a rayon loop of its own
        // (as candle's matmul of dense weights does): even with every worker some team's
        // helper, the idle helpers run that work, and every leader finishes.
        let leaders = rayon::current_num_threads().max(2);
        let (done, finished) = std::sync::mpsc::channel();
        for _ in 0..leaders {
            let done = done.clone();
            std::thread::spawn(move || {
                let sum: u64 = with_team(|| {
                    (0..50)
                        .map(|_| {
                            let pool_sum: u64 = (0..1000u64).into_par_iter().sum();
                            pool_sum + map(8, |i| i as u64).iter().sum::<u64>()
                        })
                        .sum()
                });
                let _ = done.send(sum);
            });
        }
        for _ in 0..leaders {
            let sum = finished
                .recv_timeout(std::time::Duration::from_secs(30))
                .expect("a leader waited for good on a rayon call no worker ran");
            assert_eq!(sum, 50 * (499_500 + 28));
        }
    }

    #[test]
    fn teams_of_two_engines_on_one_pool_both_finish() {
        let pool = pool(2);
        let sums: Vec<usize> = pool.install(|| {
            (0..8usize)
                .into_par_iter()
                .map(|engine| {
                    with_team(|| (0..50).map(|_| map(16, |i| i + engine).iter().sum::<usize>()))
                        .sum()
                })
                .collect()
        });
        for (engine, sum) in sums.iter().enumerate() {
            assert_eq!(*sum, 50 * (120 + 16 * engine));
        }
    }

    #[test]
    fn a_panicking_task_panics_the_leader_after_the_loop() {
        let result = pool(2).install(|| {
            catch_unwind(|| {
                with_team(|| {
                    for_each(64, |i| {
                        if i == 40 {
                            panic!("task 40");
                        }
                    })
                })
            })
        });
        assert!(result.is_err());
        // The pool still runs teams afterwards.
        let sum: usize = pool(2).install(|| with_team(|| map(10, |i| i).iter().sum()));
        assert_eq!(sum, 45);
    }
}
