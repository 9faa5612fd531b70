//! The `identity` test backend, as in Triton's QA suites: output *i* is a
//! copy of input *i* (and a sequence model's state output a copy of its
//! state input, so state is carried unchanged). Model parameter `execute_delay_ms` sleeps once per
//! execution, to make scheduling observable in tests.

use std::sync::Arc;
use std::time::Duration;

use tern_core::backend::{
    numeric_parameter, Backend, BackendSettings, ExecTiming, Instance, InstanceSpec, LoadContext,
    Model, ModelFiles,
};
use tern_core::config::ModelConfig;
use tern_core::error::{Error, Result};
use tern_core::{DataType, InferRequest, InferResponse, Tensor};

/// The identity backend.
pub struct IdentityBackend;

impl Backend for IdentityBackend {
    fn name(&self) -> &'static str {
        "identity"
    }
    fn platform(&self) -> &'static str {
        ""
    }
    fn default_filename(&self) -> Option<&'static str> {
        None
    }
    fn auto_complete(
        &self,
        _files: &ModelFiles,
        _cfg: &mut ModelConfig,
        _settings: &BackendSettings,
    ) -> Result<()> {
        Ok(())
    }
    fn load(&self, ctx: &LoadContext) -> Result<Arc<dyn Model>> {
        let cfg = ctx.config;
        // A declared output that is also a state's output is the state's copy.
        let states: Vec<&str> = tern_core::sequence::batching(cfg)
            .map(|sb| sb.state.iter().map(|s| s.output_name.as_str()).collect())
            .unwrap_or_default();
        let outputs: Vec<_> = cfg
            .output
            .iter()
            .filter(|o| !states.contains(&o.name.as_str()))
            .collect();
        if cfg.input.len() != outputs.len() {
            return Err(Error::invalid_arg(format!(
                "the identity backend needs as many outputs as inputs ({} inputs, {} outputs)",
                cfg.input.len(),
                outputs.len()
            ))
            .for_model(&cfg.name));
        }
        let mut pairs = Vec::new();
        for (i, o) in cfg.input.iter().zip(outputs) {
            if i.data_type != o.data_type {
                return Err(Error::invalid_arg(format!(
                    "identity output '{}' must have the data type of input '{}'",
                    o.name, i.name
                ))
                .for_model(&cfg.name));
            }
            pairs.push((
                i.name.clone(),
                o.name.clone(),
                DataType::from_config(o.data_type)?,
            ));
        }
        if let Some(sb) = tern_core::sequence::batching(cfg) {
            for s in &sb.state {
                pairs.push((
                    s.input_name.clone(),
                    s.output_name.clone(),
                    DataType::from_config(s.data_type)?,
                ));
            }
        }
        let delay = numeric_parameter::<u64>(cfg, "execute_delay_ms")?.unwrap_or(0);
        Ok(Arc::new(IdentityModel {
            name: cfg.name.clone(),
            version: ctx.version,
            pairs: Arc::new(pairs),
            delay: Duration::from_millis(delay),
        }))
    }
}

struct IdentityModel {
    name: String,
    version: i64,
    pairs: Arc<Vec<(String, String, DataType)>>,
    delay: Duration,
}

impl Model for IdentityModel {
    fn supports_ragged(&self) -> bool {
        true
    }

    fn create_instance(&self, _spec: &InstanceSpec) -> Result<Box<dyn Instance>> {
        Ok(Box::new(IdentityInstance {
            name: self.name.clone(),
            version: self.version,
            pairs: self.pairs.clone(),
            delay: self.delay,
        }))
    }
}

struct IdentityInstance {
    name: String,
    version: i64,
    pairs: Arc<Vec<(String, String, DataType)>>,
    delay: Duration,
}

impl Instance for IdentityInstance {
    fn execute(
        &mut self,
        batch: &[InferRequest],
        _timing: &mut ExecTiming,
    ) -> Vec<Result<InferResponse>> {
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        batch
            .iter()
            .map(|req| {
                let outputs = self
                    .pairs
                    .iter()
                    .filter_map(|(input, output, dtype)| {
                        req.input(input).map(|t| {
                            Tensor::new(output.clone(), *dtype, t.shape.clone(), t.data.clone())
                        })
                    })
                    .collect();
                Ok(InferResponse {
                    model_name: self.name.clone(),
                    model_version: self.version,
                    id: req.id.clone(),
                    outputs,
                    ..Default::default()
                })
            })
            .collect()
    }

    /// Without an execution delay it is a few pointer copies, fine on any thread.
    fn runs_on_any_thread(&self) -> bool {
        self.delay.is_zero()
    }
}
