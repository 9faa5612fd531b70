//! Triton's rate limiter (`--rate-limit=execution_count`,
//! `--rate-limit-resource`, per-instance-group `rate_limiter { resources
//! priority }`), across every model of the server: an instance executes a
//! batch only once the resources its group asks for are free on its device
//! (or, for `global` resources, in the whole server), holds them while it
//! executes, and among the instances waiting, the one with the fewest
//! executions weighted by its priority goes first (priority 2 gets half the
//! turns of priority 1).
//!
//! Totals: a resource named on the command line has that count (on every
//! device, or on the device given); any other has the largest count one
//! instance asks for, so every instance can run. An instance that asks for
//! more than a declared total could never run: its model fails to load.
//!
//! The schedulers reach the limiter through the instance itself: a limited
//! instance is wrapped ([`Limited`]) so that `execute_batch` waits for its
//! resources before the execution's clock starts (the wait counts as queue
//! time, as in Triton).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use tern_core::backend::{DeviceKind, ExecTiming, Instance};
use tern_core::config::pb::ModelRateLimiter;
use tern_core::error::{Error, Result};
use tern_core::{InferRequest, InferResponse};

/// Where a resource's copies live: one set for the server, or one per device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Scope {
    Global,
    /// GPU `n` (the CPU counts as device 0).
    Device(i32),
}

/// The device a resource copy belongs to: GPU `n`, and (as in Triton) device 0 for the CPU.
fn scope_of(device: DeviceKind) -> i32 {
    match device {
        DeviceKind::Cpu => 0,
        DeviceKind::Gpu(id) => id,
    }
}

/// `--rate-limit-resource=<name>:<count>[:<device>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceFlag {
    /// Resource name.
    pub name: String,
    /// Copies.
    pub count: u64,
    /// The GPU it is declared for; `None`: every device (and the global copy).
    pub device: Option<i32>,
}

impl std::str::FromStr for ResourceFlag {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<ResourceFlag, String> {
        let format = || {
            format!("--rate-limit-resource option format is '<resource_name>:<count>:<device>' or '<resource_name>:<count>'. Got {s}")
        };
        let parts: Vec<&str> = s.split(':').collect();
        let (name, count, device) = match parts.as_slice() {
            [name, count] => (*name, *count, None),
            [name, count, device] => (*name, *count, Some(*device)),
            _ => return Err(format()),
        };
        if name.is_empty() {
            return Err(format());
        }
        let value =
            |piece: &str| format!("--rate-limit-resource: Invalid option value. Got {piece}");
        let count = count.parse().map_err(|_| value(count))?;
        let device = device
            .map(|d| {
                d.parse::<i32>()
                    .ok()
                    .filter(|&n| n >= 0)
                    .ok_or_else(|| value(d))
            })
            .transpose()?;
        Ok(ResourceFlag {
            name: name.to_string(),
            count,
            device,
        })
    }
}

/// The server's limiter when `--rate-limit=execution_count`: instances
/// created while one is installed are limited.
static INSTALLED: std::sync::RwLock<Option<Arc<RateLimiter>>> = std::sync::RwLock::new(None);

/// Installs (or with `None` removes) the server's limiter.
pub fn install(limiter: Option<Arc<RateLimiter>>) {
    *INSTALLED.write().unwrap_or_else(|p| p.into_inner()) = limiter;
}

fn installed() -> Option<Arc<RateLimiter>> {
    INSTALLED.read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// `instance` of `config`'s group that `spec` names, limited when the
/// server's limiter is on and the group has a `rate_limiter`.
pub(super) fn limit(
    config: &tern_core::config::ModelConfig,
    spec: &tern_core::backend::InstanceSpec,
    instance: Box<dyn Instance>,
) -> Result<Box<dyn Instance>> {
    let Some(limiter) = installed() else {
        return Ok(instance);
    };
    let group = config.instance_group.iter().find(|g| {
        spec.name
            .strip_prefix(g.name.as_str())
            .and_then(|rest| rest.strip_prefix('_'))
            .is_some_and(|i| i.parse::<u32>().is_ok())
    });
    let Some(rl) = group.and_then(|g| g.rate_limiter.as_ref()) else {
        return Ok(instance);
    };
    let registration = limiter.register(&config.name, &spec.name, spec.device, Some(rl))?;
    Ok(Box::new(Limited::new(instance, registration)))
}

/// One registered instance: what it needs and how often it ran.
struct Member {
    label: String,
    needs: Vec<((String, Scope), u64)>,
    priority: u64,
    executions: u64,
}

#[derive(Default)]
struct State {
    members: HashMap<u64, Member>,
    next_id: u64,
    in_use: HashMap<(String, Scope), u64>,
    /// Waiting instances by (weighted executions, arrival), best first.
    waiting: BTreeMap<(u64, u64), u64>,
    arrivals: u64,
}

/// The server's rate limiter (see the module doc).
pub struct RateLimiter {
    declared: Vec<ResourceFlag>,
    state: Mutex<State>,
    freed: Condvar,
}

impl RateLimiter {
    /// A limiter with the `--rate-limit-resource` totals.
    pub fn new(declared: Vec<ResourceFlag>) -> Arc<RateLimiter> {
        Arc::new(RateLimiter {
            declared,
            state: Mutex::default(),
            freed: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .expect("rate limiter lock poisoned: nothing panics while holding it")
    }

    /// The declared total of `key`, if the command line names it.
    fn declared(&self, (name, scope): &(String, Scope)) -> Option<u64> {
        let named = self.declared.iter().filter(|r| &r.name == name);
        match scope {
            Scope::Global => named
                .filter(|r| r.device.is_none())
                .map(|r| r.count)
                .next_back(),
            Scope::Device(d) => {
                let mut found = None;
                for r in named {
                    match r.device {
                        Some(dev) if dev == *d => return Some(r.count),
                        None => found = Some(r.count),
                        Some(_) => {}
                    }
                }
                found
            }
        }
    }

    /// The copies of `key`: declared, else the most one registered instance asks for.
    fn total(&self, st: &State, key: &(String, Scope)) -> u64 {
        self.declared(key).unwrap_or_else(|| {
            st.members
                .values()
                .flat_map(|m| m.needs.iter())
                .filter(|(k, _)| k == key)
                .map(|(_, n)| *n)
                .max()
                .unwrap_or(0)
        })
    }

    /// Registers one instance of `model` on `device` with its group's
    /// `rate_limiter`; refused when it asks for more than a declared total.
    pub fn register(
        self: &Arc<Self>,
        model: &str,
        instance: &str,
        device: DeviceKind,
        config: Option<&ModelRateLimiter>,
    ) -> Result<Registration> {
        let mut needs: Vec<((String, Scope), u64)> = Vec::new();
        for r in config.map(|c| c.resources.as_slice()).unwrap_or_default() {
            let scope = if r.global {
                Scope::Global
            } else {
                Scope::Device(scope_of(device))
            };
            let key = (r.name.clone(), scope);
            if let Some(total) = self.declared(&key).filter(|&t| t < u64::from(r.count)) {
                return Err(Error::invalid_arg(format!(
                    "Resource count for \"{}\" is limited to {total} which will prevent scheduling of one or more model instances, the minimum required count is {}",
                    r.name, r.count
                ))
                .for_model(model));
            }
            match needs.iter_mut().find(|(k, _)| *k == key) {
                Some((_, n)) => *n += u64::from(r.count),
                None => needs.push((key, u64::from(r.count))),
            }
        }
        let priority = u64::from(config.map_or(1, |c| c.priority.max(1)));
        let mut st = self.lock();
        for ((name, scope), _) in &needs {
            let other_kind = st
                .members
                .values()
                .flat_map(|m| &m.needs)
                .any(|((n, sc), _)| {
                    n == name && (*sc == Scope::Global) != (*scope == Scope::Global)
                });
            if other_kind {
                return Err(Error::invalid_arg(format!(
                    "Resource \"{name}\" is present as both global and device-specific resource in the model configuration."
                ))
                .for_model(model));
            }
        }
        let id = st.next_id;
        st.next_id += 1;
        st.members.insert(
            id,
            Member {
                label: format!("{model}/{instance}"),
                needs,
                priority,
                executions: 0,
            },
        );
        Ok(Registration {
            limiter: self.clone(),
            id,
        })
    }

    fn fits(&self, st: &State, id: u64) -> bool {
        st.members[&id]
            .needs
            .iter()
            .all(|(key, n)| st.in_use.get(key).copied().unwrap_or(0) + n <= self.total(st, key))
    }

    /// Blocks until instance `id` may execute and takes its resources.
    fn acquire(&self, id: u64) {
        let mut st = self.lock();
        let member = &st.members[&id];
        let turn = (member.executions + 1) * member.priority;
        let arrival = st.arrivals;
        st.arrivals += 1;
        st.waiting.insert((turn, arrival), id);
        loop {
            // The best-placed waiter whose resources are free goes; one
            // that cannot fit yet does not hold back those that can.
            let next = st
                .waiting
                .iter()
                .find(|(_, &w)| self.fits(&st, w))
                .map(|(k, &w)| (*k, w));
            if let Some((k, w)) = next {
                if w == id {
                    st.waiting.remove(&k);
                    let m = st.members.get_mut(&id).expect("registered");
                    m.executions += 1;
                    let needs = m.needs.clone();
                    for (key, n) in needs {
                        *st.in_use.entry(key).or_insert(0) += n;
                    }
                    if !st.waiting.is_empty() {
                        self.freed.notify_all(); // the next one may fit too
                    }
                    return;
                }
            }
            st = self
                .freed
                .wait(st)
                .expect("rate limiter lock poisoned: nothing panics while holding it");
        }
    }

    fn release(&self, id: u64) {
        let mut st = self.lock();
        let needs = st.members[&id].needs.clone();
        for (key, n) in needs {
            if let Some(u) = st.in_use.get_mut(&key) {
                *u -= n;
            }
        }
        drop(st);
        self.freed.notify_all();
    }

    /// Instances registered now, each with what it holds, for the log.
    pub fn describe(&self) -> Vec<String> {
        let st = self.lock();
        let mut out: Vec<String> = st
            .members
            .values()
            .map(|m| {
                format!(
                    "{} (priority {}, {} executions)",
                    m.label, m.priority, m.executions
                )
            })
            .collect();
        out.sort();
        out
    }
}

/// One instance's place in the limiter; unregisters when dropped.
pub struct Registration {
    limiter: Arc<RateLimiter>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.limiter.lock().members.remove(&self.id);
        // Totals that were another instance's maximum may have shrunk.
        self.limiter.freed.notify_all();
    }
}

/// Resources held for one execution; released when dropped (also when the backend panics).
struct Held {
    limiter: Arc<RateLimiter>,
    id: u64,
}

impl Held {
    fn take(r: &Registration) -> Held {
        r.limiter.acquire(r.id);
        Held {
            limiter: r.limiter.clone(),
            id: r.id,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.limiter.release(self.id);
    }
}

/// An instance that executes only with its rate-limiter resources.
pub struct Limited {
    inner: Box<dyn Instance>,
    registration: Registration,
}

impl Limited {
    /// Wraps `inner` with its registration.
    pub fn new(inner: Box<dyn Instance>, registration: Registration) -> Limited {
        Limited {
            inner,
            registration,
        }
    }
}

impl Instance for Limited {
    fn execute(
        &mut self,
        batch: &[InferRequest],
        timing: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>> {
        self.inner.execute(batch, timing)
    }

    /// A limited instance may wait for resources: never on an async worker.
    fn runs_on_any_thread(&self) -> bool {
        false
    }

    fn admit(&mut self) -> Option<Box<dyn std::any::Any + Send>> {
        Some(Box::new(Held::take(&self.registration)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use tern_core::config::pb::model_rate_limiter::Resource;

    fn cfg(resources: &[(&str, bool, u32)], priority: u32) -> ModelRateLimiter {
        ModelRateLimiter {
            resources: resources
                .iter()
                .map(|(n, g, c)| Resource {
                    name: n.to_string(),
                    global: *g,
                    count: *c,
                })
                .collect(),
            priority,
        }
    }

    #[test]
    fn resource_flags_read_as_tritons() {
        let r: ResourceFlag = "R1:10".parse().unwrap();
        assert_eq!((r.name.as_str(), r.count, r.device), ("R1", 10, None));
        let r: ResourceFlag = "R2:5:1".parse().unwrap();
        assert_eq!(r.device, Some(1));
        for bad in [
            "R1", "R1:x", ":3", "R1:3:gpu", "R1:3:-1", "R1:1:2:3", "R1:-2",
        ] {
            assert!(bad.parse::<ResourceFlag>().is_err(), "{bad}");
        }
    }

    #[test]
    fn totals_default_to_the_largest_need_and_declared_ones_bind() {
        let l = RateLimiter::new(vec!["R1:10".parse().unwrap(), "R2:5:0".parse().unwrap()]);
        let a = l
            .register(
                "a",
                "a_0",
                DeviceKind::Cpu,
                Some(&cfg(&[("R3", false, 4)], 1)),
            )
            .unwrap();
        let _b = l
            .register(
                "b",
                "b_0",
                DeviceKind::Cpu,
                Some(&cfg(&[("R3", false, 7)], 1)),
            )
            .unwrap();
        let st = l.lock();
        assert_eq!(l.total(&st, &("R3".into(), Scope::Device(0))), 7);
        assert_eq!(l.total(&st, &("R1".into(), Scope::Device(3))), 10);
        assert_eq!(l.total(&st, &("R2".into(), Scope::Device(0))), 5);
        assert_eq!(l.total(&st, &("R1".into(), Scope::Global)), 10);
        drop(st);
        drop(a);
        let e = l
            .register(
                "c",
                "c_0",
                DeviceKind::Gpu(0),
                Some(&cfg(&[("R2", false, 6)], 1)),
            )
            .err()
            .unwrap();
        assert_eq!(
            e.message,
            "model 'c': Resource count for \"R2\" is limited to 5 which will prevent scheduling of one or more model instances, the minimum required count is 6"
        );
        // On GPU 1 the declared R2 is not there: the default applies.
        l.register(
            "c",
            "c_1",
            DeviceKind::Gpu(1),
            Some(&cfg(&[("R2", false, 6)], 1)),
        )
        .unwrap();
    }

    /// Two instances that each need the one copy of a resource never run
    /// together; one that needs nothing is never held back.
    #[test]
    fn a_shared_resource_serialises_its_holders() {
        let l = RateLimiter::new(vec!["R:1".parse().unwrap()]);
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..3)
            .map(|i| {
                let needs: &[(&str, bool, u32)] = if i < 2 { &[("R", true, 1)] } else { &[] };
                let reg = l
                    .register(
                        "m",
                        &format!("m_{i}"),
                        DeviceKind::Cpu,
                        Some(&cfg(needs, 1)),
                    )
                    .unwrap();
                let (running, most) = (running.clone(), most.clone());
                std::thread::spawn(move || {
                    for _ in 0..20 {
                        let held = Held::take(&reg);
                        if i < 2 {
                            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(1));
                            running.fetch_sub(1, Ordering::SeqCst);
                        }
                        drop(held);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 1);
    }

    /// With the resource contended (two instances of each priority, so
    /// there is always a choice when it frees), priority 1 gets about twice
    /// the turns of priority 2.
    #[test]
    fn priorities_weight_the_turns() {
        let l = RateLimiter::new(vec!["R:1".parse().unwrap()]);
        let counts: Vec<Arc<AtomicUsize>> = (0..2).map(|_| Arc::new(AtomicUsize::new(0))).collect();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads: Vec<_> = [1u32, 2, 1, 2]
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                let reg = l
                    .register(
                        "m",
                        &format!("m_{i}"),
                        DeviceKind::Cpu,
                        Some(&cfg(&[("R", false, 1)], p)),
                    )
                    .unwrap();
                let (count, stop) = (counts[i % 2].clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        let held = Held::take(&reg);
                        count.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(2));
                        drop(held);
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(800));
        stop.store(true, Ordering::SeqCst);
        for t in threads {
            t.join().unwrap();
        }
        let (one, two) = (
            counts[0].load(Ordering::SeqCst),
            counts[1].load(Ordering::SeqCst),
        );
        assert!(one > 20 && two > 10, "{one} {two}");
        let ratio = one as f64 / two as f64;
        assert!(
            (1.6..2.5).contains(&ratio),
            "priority 1 ran {one} times, priority 2 {two}"
        );
    }
}
