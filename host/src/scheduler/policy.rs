//! Scheduling policy derived from a model's config: whether requests are
//! batched, preferred sizes, queue delay, priority levels and per-level
//! queue policies (timeouts, REJECT/DELAY, maximum queue size), plus the
//! per-request priority and timeout parameters.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use tern_core::config::pb::{
    model_config::SchedulingChoice, model_queue_policy::TimeoutAction, ModelQueuePolicy,
};
use tern_core::config::ModelConfig;
use tern_core::error::{Error, Result};
use tern_core::{InferRequest, Parameter};

/// What happens to a request whose queue timeout expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTimeout {
    /// Respond with an error.
    Reject,
    /// Keep it, behind every request of its level (and above) that has not timed out.
    Delay,
}

/// Queue policy of one priority level.
#[derive(Debug, Clone, PartialEq)]
pub struct LevelPolicy {
    /// Action on timeout.
    pub on_timeout: OnTimeout,
    /// Default timeout; `None` = no timeout.
    pub default_timeout: Option<Duration>,
    /// Whether a request's `timeout` parameter may shorten the default.
    pub allow_override: bool,
    /// Maximum queued requests at this level; `None` = unbounded.
    pub max_queue_size: Option<usize>,
}

impl From<&ModelQueuePolicy> for LevelPolicy {
    fn from(p: &ModelQueuePolicy) -> Self {
        LevelPolicy {
            on_timeout: if p.timeout_action == TimeoutAction::Delay as i32 {
                OnTimeout::Delay
            } else {
                OnTimeout::Reject
            },
            default_timeout: (p.default_timeout_microseconds > 0)
                .then(|| Duration::from_micros(p.default_timeout_microseconds)),
            allow_override: p.allow_timeout_override,
            max_queue_size: (p.max_queue_size > 0).then_some(p.max_queue_size as usize),
        }
    }
}

/// How a model's requests are queued and grouped into executions.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchPolicy {
    /// Dynamic batching on; off = one request per execution, in arrival order.
    pub dynamic: bool,
    /// Largest batch (sum of request batch sizes); 1 for models that do not batch.
    pub max_batch_size: usize,
    /// Preferred batch sizes, ascending.
    pub preferred: Vec<usize>,
    /// `max_queue_delay_microseconds`.
    pub max_delay: Duration,
    /// Release responses in arrival order.
    pub preserve_ordering: bool,
    /// Number of priority levels (at least 1; any `u64`, levels exist only
    /// while requests are queued at them).
    pub levels: u64,
    /// Level (1-based) of requests without a priority.
    pub default_level: u64,
    /// Levels with their own `priority_queue_policy`.
    pub level_policies: BTreeMap<u64, LevelPolicy>,
    /// The policy of every other level (`default_queue_policy`).
    pub default_policy: LevelPolicy,
    /// Inputs whose shapes may differ within a batch.
    pub ragged: HashSet<String>,
    /// `TRITONSERVER_DELAY_SCHEDULER`: hold requests until this many are queued (once).
    pub delay_hook: Option<usize>,
}

impl BatchPolicy {
    /// Derives the policy from a normalised config. `ragged_ok` says whether the backend
    /// accepts ragged batches.
    pub fn from_config(cfg: &ModelConfig, ragged_ok: bool) -> Result<BatchPolicy> {
        let max_batch_size = cfg.max_batch_size.max(1) as usize;
        // As in Triton, `dynamic_batching` on a model that does not batch
        // (max_batch_size 0) still gives it the dynamic batcher's queue: its
        // priority levels and queue policies apply, and batches hold one request.
        let db = match &cfg.scheduling_choice {
            Some(SchedulingChoice::DynamicBatching(db)) => Some(db),
            _ => None,
        };
        let Some(db) = db else {
            return Ok(BatchPolicy {
                dynamic: false,
                max_batch_size,
                preferred: vec![],
                max_delay: Duration::ZERO,
                preserve_ordering: false,
                levels: 1,
                default_level: 1,
                level_policies: BTreeMap::new(),
                default_policy: LevelPolicy::from(&ModelQueuePolicy::default()),
                ragged: HashSet::new(),
                delay_hook: None,
            });
        };
        let levels = db.priority_levels.max(1);
        let default_level = if db.priority_levels == 0 {
            1
        } else {
            db.default_priority_level
        };
        if default_level < 1 || default_level > levels {
            return Err(Error::invalid_arg(format!(
                "default priority level must be in range [1, {levels}] for {}: dynamic_batching default_priority_level is {}",
                cfg.name, db.default_priority_level
            )));
        }
        let default_policy = db
            .default_queue_policy
            .as_ref()
            .map(LevelPolicy::from)
            .unwrap_or_else(|| LevelPolicy::from(&ModelQueuePolicy::default()));
        for level in db.priority_queue_policy.keys() {
            if *level < 1 || *level > levels {
                return Err(Error::invalid_arg(format!(
                    "priority queue policy must have priority level in range [1, {levels}] for {}: priority_queue_policy names level {level}",
                    cfg.name
                )));
            }
        }
        let level_policies = db
            .priority_queue_policy
            .iter()
            .map(|(l, p)| (*l, LevelPolicy::from(p)))
            .collect();
        let mut preferred: Vec<usize> = db
            .preferred_batch_size
            .iter()
            .filter(|_| cfg.max_batch_size > 0)
            .map(|&p| p as usize)
            .collect();
        preferred.sort_unstable();
        preferred.dedup();
        let ragged = if ragged_ok {
            cfg.input
                .iter()
                .filter(|i| i.allow_ragged_batch)
                .map(|i| i.name.clone())
                .collect()
        } else {
            HashSet::new()
        };
        let delay_hook = std::env::var("TRITONSERVER_DELAY_SCHEDULER")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0);
        Ok(BatchPolicy {
            dynamic: true,
            max_batch_size,
            preferred,
            max_delay: Duration::from_micros(db.max_queue_delay_microseconds),
            preserve_ordering: db.preserve_ordering,
            levels,
            default_level,
            level_policies,
            default_policy,
            ragged,
            delay_hook,
        })
    }

    /// The largest preferred batch size (`max_batch_size` when none is given):
    /// a batch that reaches it is sent at once.
    pub fn max_preferred(&self) -> usize {
        self.preferred
            .last()
            .copied()
            .unwrap_or(self.max_batch_size)
    }

    /// The queue policy of a priority level.
    pub fn level_policy(&self, level: u64) -> &LevelPolicy {
        self.level_policies
            .get(&level)
            .unwrap_or(&self.default_policy)
    }

    /// The priority level (1-based) and queue timeout of a request, from its
    /// `priority` and `timeout` (microseconds) parameters. As in Triton, a
    /// priority of 0 or above the model's levels means the default level.
    pub fn placement(&self, req: &InferRequest) -> Result<(u64, Option<Duration>)> {
        let level = match req.parameters.get("priority") {
            None => self.default_level,
            Some(Parameter::Int(p)) if *p >= 0 => {
                let p = *p as u64;
                if p == 0 || p > self.levels {
                    self.default_level
                } else {
                    p
                }
            }
            Some(other) => {
                return Err(Error::invalid_arg(format!(
                    "request parameter 'priority' must be a non-negative integer, got {other:?}"
                )))
            }
        };
        let policy = self.level_policy(level);
        let requested = match req.parameters.get("timeout") {
            None => None,
            Some(Parameter::Int(t)) if *t >= 0 => (*t > 0).then(|| Duration::from_micros(*t as u64)),
            Some(other) => {
                return Err(Error::invalid_arg(format!("request parameter 'timeout' must be a non-negative integer (microseconds), got {other:?}")))
            }
        };
        let timeout = match (policy.default_timeout, requested) {
            (d, Some(r)) if policy.allow_override && d.is_none_or(|d| r < d) => Some(r),
            (d, _) => d,
        };
        Ok((level, timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_core::config::parse_pbtxt;

    fn policy(extra: &str) -> BatchPolicy {
        let cfg = parse_pbtxt(&format!("name: \"m\" max_batch_size: 8 input [{{name: \"X\" data_type: TYPE_FP32 dims: [-1] allow_ragged_batch: true}}] {extra}")).unwrap();
        BatchPolicy::from_config(&cfg, true).unwrap()
    }

    fn req(params: &[(&str, i64)]) -> InferRequest {
        let mut r = InferRequest::default();
        for (k, v) in params {
            r.parameters.insert(k.to_string(), Parameter::Int(*v));
        }
        r
    }

    #[test]
    fn default_scheduler_without_dynamic_batching() {
        let p = policy("");
        assert!(!p.dynamic);
        assert!(p.ragged.is_empty());
    }

    #[test]
    fn a_model_without_batching_keeps_the_dynamic_batchers_queue_policies() {
        let cfg = parse_pbtxt(
            "name: \"m\" max_batch_size: 0 input [{name: \"X\" data_type: TYPE_FP32 dims: [4]}]
             dynamic_batching { preferred_batch_size: [4] max_queue_delay_microseconds: 100000 priority_levels: 2 default_priority_level: 2
               default_queue_policy { max_queue_size: 3 default_timeout_microseconds: 500 } }",
        )
        .unwrap();
        let p = BatchPolicy::from_config(&cfg, true).unwrap();
        assert!(p.dynamic);
        assert_eq!((p.max_batch_size, p.max_preferred()), (1, 1));
        assert_eq!(p.levels, 2);
        assert_eq!(p.level_policy(1).max_queue_size, Some(3));
        assert_eq!(
            p.placement(&req(&[])).unwrap(),
            (2, Some(Duration::from_micros(500)))
        );
    }

    #[test]
    fn priorities_and_timeouts() {
        let p = policy(
            "dynamic_batching { preferred_batch_size: [4, 2] max_queue_delay_microseconds: 100 priority_levels: 3 default_priority_level: 2
               default_queue_policy { default_timeout_microseconds: 1000 allow_timeout_override: true max_queue_size: 5 }
               priority_queue_policy { key: 1 value: { timeout_action: DELAY default_timeout_microseconds: 50 } } }",
        );
        assert!(p.dynamic);
        assert_eq!(p.preferred, vec![2, 4]);
        assert!(p.ragged.contains("X"));
        assert_eq!(
            p.placement(&req(&[])).unwrap(),
            (2, Some(Duration::from_micros(1000)))
        );
        // Override may only shorten.
        assert_eq!(
            p.placement(&req(&[("timeout", 10)])).unwrap().1,
            Some(Duration::from_micros(10))
        );
        assert_eq!(
            p.placement(&req(&[("timeout", 5000)])).unwrap().1,
            Some(Duration::from_micros(1000))
        );
        // Level 1 has its own policy, without override.
        assert_eq!(
            p.placement(&req(&[("priority", 1), ("timeout", 10)]))
                .unwrap(),
            (1, Some(Duration::from_micros(50)))
        );
        assert_eq!(p.level_policy(1).on_timeout, OnTimeout::Delay);
        assert_eq!(p.level_policy(3).max_queue_size, Some(5));
        // Out of range: the default level, as Triton.
        assert_eq!(p.placement(&req(&[("priority", 4)])).unwrap().0, 2);
        assert!(p.placement(&req(&[("priority", -1)])).is_err());
    }

    #[test]
    fn huge_priority_levels_cost_nothing() {
        let p = policy(
            "dynamic_batching { priority_levels: 18446744073709551615 default_priority_level: 4294967296 }",
        );
        assert_eq!(p.levels, u64::MAX);
        assert_eq!(p.default_level, 4_294_967_296);
        assert_eq!(
            p.placement(&req(&[("priority", i64::MAX)])).unwrap().0,
            i64::MAX as u64
        );
    }
}
