//! `yolo_post`: YOLOv8 detection post-processing with the host's kernels
//! (`tern_plugin::ops`), as nudenet's `NudeDetector` does it: boxes whose
//! best class score reaches `decode_threshold` (0.2), mapped back from the
//! square-padded model input to the image (`* (size + pad) / input_size`),
//! clipped to the image, then non-maximum suppression across classes
//! (`nms_score_threshold` 0.25, `iou_threshold` 0.45, OpenCV's rules).
//!
//! output0 (FP32 [4 + classes, anchors], the detector's output) and META
//! (FP32 [4]: width, height, x padding, y padding, from the preprocessing)
//! -> BOXES (INT32 [n, 4]: x, y, width, height, truncated as nudenet does),
//! SCORES (FP32 [n]) and LABELS (BYTES [n], from `labels.txt` in the
//! model's version folder, one per line).

use tern_plugin::ops::{self, Array, Detection, YoloLayout};
use tern_plugin::{export_model, Error, Model, ModelContext, Request, Response, Tensor};

struct YoloPost {
    labels: Vec<String>,
    input_size: f32,
    decode_threshold: f32,
    nms_score_threshold: f32,
    iou_threshold: f32,
}

fn param(ctx: &ModelContext, key: &str, default: f32) -> Result<f32, Error> {
    match ctx.parameter(key) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|_| {
            Error::invalid_arg(format!("parameter '{key}' must be a number, got '{v}'"))
        }),
    }
}

impl YoloPost {
    fn run(&self, index: usize, request: &Request) -> Result<Response, Error> {
        let output = Array::input(index as u32, "output0")?;
        // The raw rows, read in place for nudenet's arithmetic on them.
        let raw = request.input("output0")?.as_slice::<f32>()?;
        let meta = Array::input(index as u32, "META")?.to_f32()?;
        let [width, height, x_pad, y_pad] = meta[..] else {
            return Err(Error::invalid_arg(format!(
                "META must have 4 values, got {}",
                meta.len()
            )));
        };
        // [1, 4 + classes, anchors] for this request.
        let shape = output.shape();
        let output = output.reshape(&[1, shape[shape.len() - 2], shape[shape.len() - 1]])?;
        let candidates = ops::yolo_decode(&output, YoloLayout::V8, self.decode_threshold)?;
        let anchors = shape[shape.len() - 1];
        let boxes: Vec<Detection> = candidates
            .into_iter()
            .map(|d| {
                // nudenet's arithmetic, in FP32 as numpy does it.
                let at = |row: usize| raw[row * anchors as usize + d.anchor as usize];
                let (w, h) = (at(2), at(3));
                let (x, y) = (at(0) - w / 2.0, at(1) - h / 2.0);
                let x = (x * (width + x_pad) / self.input_size).clamp(0.0, width);
                let y = (y * (height + y_pad) / self.input_size).clamp(0.0, height);
                let w = (w * (width + x_pad) / self.input_size).min(width - x);
                let h = (h * (height + y_pad) / self.input_size).min(height - y);
                Detection {
                    x1: x,
                    y1: y,
                    x2: x + w,
                    y2: y + h,
                    ..d
                }
            })
            .collect();
        let kept = ops::nms(
            &boxes,
            self.nms_score_threshold,
            self.iou_threshold,
            0,
            false,
        );
        let n = kept.len() as i64;
        let mut xywh = Vec::with_capacity(kept.len() * 4);
        let mut scores = Vec::with_capacity(kept.len());
        let mut labels = Vec::with_capacity(kept.len());
        for &k in &kept {
            let d = boxes[k as usize];
            xywh.extend([
                d.x1 as i32,
                d.y1 as i32,
                (d.x2 - d.x1) as i32,
                (d.y2 - d.y1) as i32,
            ]);
            scores.push(d.score);
            let label = self.labels.get(d.class_id as usize).cloned();
            labels.push(label.unwrap_or_else(|| d.class_id.to_string()));
        }
        Ok(Response::new(vec![
            Tensor::from_vec("BOXES", vec![1, n, 4], xywh),
            Tensor::from_vec("SCORES", vec![1, n], scores),
            Tensor::from_strings("LABELS", vec![1, n], &labels),
        ]))
    }
}

impl Model for YoloPost {
    fn initialize(ctx: ModelContext) -> Result<Self, Error> {
        let labels = String::from_utf8_lossy(&ctx.read_file("labels.txt")?)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect();
        Ok(YoloPost {
            labels,
            input_size: param(&ctx, "input_size", 320.0)?,
            decode_threshold: param(&ctx, "decode_threshold", 0.2)?,
            nms_score_threshold: param(&ctx, "nms_score_threshold", 0.25)?,
            iou_threshold: param(&ctx, "iou_threshold", 0.45)?,
        })
    }

    fn execute(&mut self, requests: Vec<Request>) -> Vec<Result<Response, Error>> {
        requests
            .iter()
            .enumerate()
            .map(|(i, r)| self.run(i, r))
            .collect()
    }
}

export_model!(YoloPost);
