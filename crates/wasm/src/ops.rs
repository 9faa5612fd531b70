//! The host side of the `tern:plugin/ops` interface: the plugin's arrays
//! live in its store's resource table as [`ArrayHandle`]s, their bytes are
//! counted against the instance's memory cap together with its linear
//! memory ([`Limits`](crate::host::Limits)), and every call maps onto a
//! kernel of `tern-ops`.

use wasmtime::component::Resource;

use super::host::{dtype_from_wit, dtype_to_wit, error_to_wit, HostState};
use super::tern::plugin::ops as wit_ops;
use super::tern::plugin::types as wit;
use tern_core::error::{Error, Result};
use tern_core::Tensor;
use tern_ops::detect::{self, Detection, YoloLayout};
use tern_ops::image::{self, Color, Filter, Layout};
use tern_ops::math::{self, BinaryOp, ReduceOp, UnaryOp};
use tern_ops::Array;

/// The host side of an `array` resource.
pub struct ArrayHandle(Array);

type Out<T> = std::result::Result<T, wit::Error>;

fn wit_err(e: Error) -> wit::Error {
    error_to_wit(&e)
}

impl HostState {
    /// Bytes the instance may still allocate on the host side.
    fn ops_budget(&self) -> usize {
        self.limits
            .max_memory
            .saturating_sub(self.limits.linear)
            .saturating_sub(self.limits.host)
    }

    /// Holds `a` for the plugin, if it fits under the memory cap.
    fn hold(&mut self, a: Array) -> Out<Resource<ArrayHandle>> {
        let size = a.byte_len();
        if size > self.ops_budget() {
            return Err(wit_err(
                Error::unavailable(format!(
                    "an array of {size} bytes would pass the plugin's memory cap of {} bytes \
                 (max_memory_bytes; {} bytes of linear memory and {} bytes of arrays in use)",
                    self.limits.max_memory, self.limits.linear, self.limits.host
                ))
                .for_model(&self.model),
            ));
        }
        let r = self
            .table
            .push(ArrayHandle(a))
            .map_err(|e| wit_err(Error::internal(format!("array table: {e}"))))?;
        self.limits.host += size;
        Ok(r)
    }

    fn array(&self, r: &Resource<ArrayHandle>) -> Out<&Array> {
        self.table
            .get(r)
            .map(|h| &h.0)
            .map_err(|e| wit_err(Error::invalid_arg(format!("array: {e}"))))
    }

    /// Runs a kernel on one array and holds its result.
    fn map(
        &mut self,
        r: &Resource<ArrayHandle>,
        f: impl FnOnce(&Array) -> Result<Array>,
    ) -> Out<Resource<ArrayHandle>> {
        let out = f(self.array(r)?).map_err(wit_err)?;
        self.hold(out)
    }

    /// Input `name` of request `index` of the running batch.
    fn running_input(&self, index: u32, name: &str) -> Result<Array> {
        let req = self.running.get(index as usize).ok_or_else(|| {
            Error::invalid_arg(format!(
                "no request {index} in the running batch ({} requests)",
                self.running.len()
            ))
        })?;
        let t =
            req.inputs.iter().find(|t| t.name == name).ok_or_else(|| {
                Error::invalid_arg(format!("request {index} has no input '{name}'"))
            })?;
        Array::from_wire(t.dtype, &t.shape, t.data.clone())
    }
}

fn u(v: u32) -> usize {
    v as usize
}

fn color(c: wit_ops::Color) -> Color {
    match c {
        wit_ops::Color::Gray => Color::Gray,
        wit_ops::Color::Rgb => Color::Rgb,
        wit_ops::Color::Bgr => Color::Bgr,
        wit_ops::Color::Rgba => Color::Rgba,
        wit_ops::Color::Bgra => Color::Bgra,
    }
}

fn filter(f: wit_ops::Filter) -> Filter {
    match f {
        wit_ops::Filter::Nearest => Filter::Nearest,
        wit_ops::Filter::Bilinear => Filter::Bilinear,
        wit_ops::Filter::Area => Filter::Area,
    }
}

fn binary_op(op: wit_ops::BinaryOp) -> BinaryOp {
    match op {
        wit_ops::BinaryOp::Add => BinaryOp::Add,
        wit_ops::BinaryOp::Sub => BinaryOp::Sub,
        wit_ops::BinaryOp::Mul => BinaryOp::Mul,
        wit_ops::BinaryOp::Div => BinaryOp::Div,
        wit_ops::BinaryOp::Maximum => BinaryOp::Maximum,
        wit_ops::BinaryOp::Minimum => BinaryOp::Minimum,
        wit_ops::BinaryOp::Pow => BinaryOp::Pow,
    }
}

fn unary_op(op: wit_ops::UnaryOp) -> UnaryOp {
    match op {
        wit_ops::UnaryOp::Sigmoid => UnaryOp::Sigmoid,
        wit_ops::UnaryOp::Exp => UnaryOp::Exp,
        wit_ops::UnaryOp::Log => UnaryOp::Log,
        wit_ops::UnaryOp::Abs => UnaryOp::Abs,
        wit_ops::UnaryOp::Neg => UnaryOp::Neg,
        wit_ops::UnaryOp::Sqrt => UnaryOp::Sqrt,
        wit_ops::UnaryOp::Tanh => UnaryOp::Tanh,
        wit_ops::UnaryOp::Round => UnaryOp::Round,
        wit_ops::UnaryOp::Floor => UnaryOp::Floor,
        wit_ops::UnaryOp::Ceil => UnaryOp::Ceil,
    }
}

fn reduce_op(op: wit_ops::ReduceOp) -> ReduceOp {
    match op {
        wit_ops::ReduceOp::Sum => ReduceOp::Sum,
        wit_ops::ReduceOp::Mean => ReduceOp::Mean,
        wit_ops::ReduceOp::Max => ReduceOp::Max,
        wit_ops::ReduceOp::Min => ReduceOp::Min,
    }
}

fn det_from_wit(d: wit_ops::Detection) -> Detection {
    Detection {
        x1: d.x1,
        y1: d.y1,
        x2: d.x2,
        y2: d.y2,
        score: d.score,
        class_id: d.class_id,
        anchor: d.anchor,
    }
}

fn det_to_wit(d: Detection) -> wit_ops::Detection {
    wit_ops::Detection {
        x1: d.x1,
        y1: d.y1,
        x2: d.x2,
        y2: d.y2,
        score: d.score,
        class_id: d.class_id,
        anchor: d.anchor,
    }
}

impl wit_ops::HostArray for HostState {
    fn from_data(
        &mut self,
        datatype: wit::DataType,
        shape: Vec<i64>,
        data: Vec<u8>,
    ) -> Out<Resource<ArrayHandle>> {
        let a = Array::from_wire(dtype_from_wit(datatype), &shape, data.into()).map_err(wit_err)?;
        self.hold(a)
    }

    fn input(&mut self, index: u32, name: String) -> Out<Resource<ArrayHandle>> {
        let a = self.running_input(index, &name).map_err(wit_err)?;
        self.hold(a)
    }

    // `datatype`, `shape` and `data` cannot return an error in the WIT; the
    // handle they get is one of this store's arrays (wasmtime checks resource
    // types), so the lookup does not fail in practice.
    fn datatype(&mut self, r: Resource<ArrayHandle>) -> wit::DataType {
        self.array(&r)
            .map(|a| dtype_to_wit(a.dtype()))
            .unwrap_or(wit::DataType::Uint8)
    }

    fn shape(&mut self, r: Resource<ArrayHandle>) -> Vec<i64> {
        self.array(&r).map(|a| a.wire_shape()).unwrap_or_default()
    }

    fn data(&mut self, r: Resource<ArrayHandle>) -> Vec<u8> {
        self.array(&r)
            .map(|a| a.data().to_vec())
            .unwrap_or_default()
    }

    fn reshape(&mut self, r: Resource<ArrayHandle>, shape: Vec<i64>) -> Out<Resource<ArrayHandle>> {
        self.map(&r, |a| a.reshape(&shape))
    }

    fn transpose(
        &mut self,
        r: Resource<ArrayHandle>,
        perm: Vec<u32>,
    ) -> Out<Resource<ArrayHandle>> {
        let perm: Vec<usize> = perm.into_iter().map(u).collect();
        self.map(&r, |a| a.transpose(&perm))
    }

    fn slice(
        &mut self,
        r: Resource<ArrayHandle>,
        axis: u32,
        start: i64,
        end: i64,
        step: i64,
    ) -> Out<Resource<ArrayHandle>> {
        self.map(&r, |a| a.slice(u(axis), start, end, step))
    }

    fn cast(
        &mut self,
        r: Resource<ArrayHandle>,
        datatype: wit::DataType,
    ) -> Out<Resource<ArrayHandle>> {
        self.map(&r, |a| a.cast(dtype_from_wit(datatype)))
    }

    fn binary(
        &mut self,
        r: Resource<ArrayHandle>,
        op: wit_ops::BinaryOp,
        other: Resource<ArrayHandle>,
    ) -> Out<Resource<ArrayHandle>> {
        let (a, b) = (self.array(&r)?, self.array(&other)?);
        // Broadcasting can make a result far larger than its operands
        // ([n, 1] x [1, n]): refuse it before the kernel allocates its
        // working values (f64 per element).
        let shape = math::broadcast(a.shape(), b.shape()).map_err(wit_err)?;
        let need = shape
            .iter()
            .try_fold(8u64, |n, &d| n.checked_mul(d as u64))
            .unwrap_or(u64::MAX);
        self.check_budget(need, &format!("a broadcast result of shape {shape:?}"))?;
        let out = math::binary(binary_op(op), a, b).map_err(wit_err)?;
        self.hold(out)
    }

    fn scalar(
        &mut self,
        r: Resource<ArrayHandle>,
        op: wit_ops::BinaryOp,
        value: f64,
    ) -> Out<Resource<ArrayHandle>> {
        self.map(&r, |a| math::scalar(binary_op(op), a, value))
    }

    fn unary(
        &mut self,
        r: Resource<ArrayHandle>,
        op: wit_ops::UnaryOp,
    ) -> Out<Resource<ArrayHandle>> {
        self.map(&r, |a| math::unary(unary_op(op), a))
    }

    fn clip(
        &mut self,
        r: Resource<ArrayHandle>,
        low: f64,
        high: f64,
    ) -> Out<Resource<ArrayHandle>> {
        self.map(&r, |a| math::clip(a, low, high))
    }

    fn softmax(&mut self, r: Resource<ArrayHandle>, axis: u32) -> Out<Resource<ArrayHandle>> {
        self.map(&r, |a| math::softmax(a, u(axis)))
    }

    fn reduce(
        &mut self,
        r: Resource<ArrayHandle>,
        op: wit_ops::ReduceOp,
        axis: u32,
    ) -> Out<Resource<ArrayHandle>> {
        self.map(&r, |a| math::reduce(reduce_op(op), a, u(axis)))
    }

    fn argmax(&mut self, r: Resource<ArrayHandle>, axis: u32) -> Out<Resource<ArrayHandle>> {
        self.map(&r, |a| math::argmax(a, u(axis)))
    }

    fn top_k(
        &mut self,
        r: Resource<ArrayHandle>,
        k: u32,
        axis: u32,
    ) -> Out<(Resource<ArrayHandle>, Resource<ArrayHandle>)> {
        let (values, indices) = math::top_k(self.array(&r)?, u(k), u(axis)).map_err(wit_err)?;
        let values = self.hold(values)?;
        match self.hold(indices) {
            Ok(indices) => Ok((values, indices)),
            Err(e) => {
                let _ = wit_ops::HostArray::drop(self, values);
                Err(e)
            }
        }
    }

    fn split(
        &mut self,
        r: Resource<ArrayHandle>,
        axis: u32,
        sizes: Vec<u64>,
    ) -> Out<Vec<Resource<ArrayHandle>>> {
        let sizes: Vec<usize> = sizes.into_iter().map(|s| s as usize).collect();
        let parts = self.array(&r)?.split(u(axis), &sizes).map_err(wit_err)?;
        let mut held = Vec::with_capacity(parts.len());
        for p in parts {
            match self.hold(p) {
                Ok(h) => held.push(h),
                Err(e) => {
                    for h in held {
                        let _ = wit_ops::HostArray::drop(self, h);
                    }
                    return Err(e);
                }
            }
        }
        Ok(held)
    }

    fn concat(
        &mut self,
        arrays: Vec<Resource<ArrayHandle>>,
        axis: u32,
    ) -> Out<Resource<ArrayHandle>> {
        let parts = arrays
            .iter()
            .map(|r| self.array(r))
            .collect::<Out<Vec<&Array>>>()?;
        let out = Array::concat(&parts, u(axis)).map_err(wit_err)?;
        self.hold(out)
    }

    fn drop(&mut self, r: Resource<ArrayHandle>) -> wasmtime::Result<()> {
        let h = self.table.delete(r)?;
        self.limits.host = self.limits.host.saturating_sub(h.0.byte_len());
        Ok(())
    }
}

impl wit_ops::Host for HostState {
    fn probe_image(&mut self, data: Vec<u8>) -> Out<wit_ops::ImageInfo> {
        let (width, height, channels) = image::probe(&data).map_err(wit_err)?;
        Ok(wit_ops::ImageInfo {
            width,
            height,
            channels,
        })
    }

    fn decode_image(&mut self, data: Vec<u8>, c: wit_ops::Color) -> Out<Resource<ArrayHandle>> {
        let a = image::decode(&data, color(c), self.ops_budget()).map_err(wit_err)?;
        self.hold(a)
    }

    fn convert_color(
        &mut self,
        img: Resource<ArrayHandle>,
        from: wit_ops::Color,
        to: wit_ops::Color,
    ) -> Out<Resource<ArrayHandle>> {
        self.map(&img, |a| image::convert_color(a, color(from), color(to)))
    }

    fn resize(
        &mut self,
        img: Resource<ArrayHandle>,
        height: u32,
        width: u32,
        f: wit_ops::Filter,
    ) -> Out<Resource<ArrayHandle>> {
        self.check_pixels(&img, height, width)?;
        self.map(&img, |a| image::resize(a, u(height), u(width), filter(f)))
    }

    fn pad(
        &mut self,
        img: Resource<ArrayHandle>,
        top: u32,
        bottom: u32,
        left: u32,
        right: u32,
        value: u8,
    ) -> Out<Resource<ArrayHandle>> {
        let (h, w, _) = image::hwc(self.array(&img)?).map_err(wit_err)?;
        let (oh, ow) = (
            h as u64 + top as u64 + bottom as u64,
            w as u64 + left as u64 + right as u64,
        );
        self.check_pixels(
            &img,
            oh.min(u32::MAX as u64) as u32,
            ow.min(u32::MAX as u64) as u32,
        )?;
        self.map(&img, |a| {
            image::pad(a, u(top), u(bottom), u(left), u(right), value)
        })
    }

    fn crop(
        &mut self,
        img: Resource<ArrayHandle>,
        top: u32,
        left: u32,
        height: u32,
        width: u32,
    ) -> Out<Resource<ArrayHandle>> {
        self.map(&img, |a| {
            image::crop(a, u(top), u(left), u(height), u(width))
        })
    }

    fn letterbox(
        &mut self,
        img: Resource<ArrayHandle>,
        height: u32,
        width: u32,
        value: u8,
        f: wit_ops::Filter,
    ) -> Out<(Resource<ArrayHandle>, wit_ops::LetterboxInfo)> {
        self.check_pixels(&img, height, width)?;
        let (out, info) =
            image::letterbox(self.array(&img)?, u(height), u(width), value, filter(f))
                .map_err(wit_err)?;
        Ok((
            self.hold(out)?,
            wit_ops::LetterboxInfo {
                scale: info.scale,
                pad_top: info.pad_top as u32,
                pad_left: info.pad_left as u32,
            },
        ))
    }

    fn normalize(
        &mut self,
        img: Resource<ArrayHandle>,
        layout: wit_ops::Layout,
        datatype: wit::DataType,
        scale: f64,
        mean: Vec<f64>,
        std: Vec<f64>,
    ) -> Out<Resource<ArrayHandle>> {
        let layout = match layout {
            wit_ops::Layout::Nchw => Layout::Nchw,
            wit_ops::Layout::Nhwc => Layout::Nhwc,
        };
        let dtype = dtype_from_wit(datatype);
        self.map(&img, |a| {
            image::normalize(a, layout, dtype, scale, &mean, &std)
        })
    }

    fn yolo_decode(
        &mut self,
        output: Resource<ArrayHandle>,
        layout: wit_ops::YoloLayout,
        score_threshold: f32,
    ) -> Out<Vec<wit_ops::Detection>> {
        let layout = match layout {
            wit_ops::YoloLayout::V8 => YoloLayout::V8,
            wit_ops::YoloLayout::V5 => YoloLayout::V5,
        };
        let d =
            detect::yolo_decode(self.array(&output)?, layout, score_threshold).map_err(wit_err)?;
        Ok(d.into_iter().map(det_to_wit).collect())
    }

    fn iou(&mut self, a: wit_ops::Detection, b: wit_ops::Detection) -> f32 {
        detect::iou(&det_from_wit(a), &det_from_wit(b))
    }

    fn nms(
        &mut self,
        boxes: Vec<wit_ops::Detection>,
        score_threshold: f32,
        iou_threshold: f32,
        max_detections: u32,
        class_aware: bool,
    ) -> Vec<u32> {
        let boxes: Vec<Detection> = boxes.into_iter().map(det_from_wit).collect();
        detect::nms(
            &boxes,
            score_threshold,
            iou_threshold,
            u(max_detections),
            class_aware,
        )
    }

    fn set_output(&mut self, index: u32, name: String, array: Resource<ArrayHandle>) -> Out<()> {
        if index as usize >= self.running.len() {
            return Err(wit_err(Error::invalid_arg(format!(
                "set-output: no request {index} in the running batch ({} requests)",
                self.running.len()
            ))));
        }
        let a = self.array(&array)?;
        let tensor = Tensor {
            name: name.clone(),
            dtype: a.dtype(),
            shape: a.wire_shape(),
            data: a.data().clone(),
        };
        let outputs = &mut self.running[index as usize].outputs;
        outputs.retain(|t| t.name != name);
        outputs.push(tensor);
        Ok(())
    }
}

impl HostState {
    /// Refuses an image operation whose `height` x `width` result (with the
    /// source's channels) would not fit under the memory cap, before the
    /// kernel allocates it.
    fn check_pixels(&self, img: &Resource<ArrayHandle>, height: u32, width: u32) -> Out<()> {
        let (_, _, c) = image::hwc(self.array(img)?).map_err(wit_err)?;
        let need = height as u64 * width as u64 * c as u64;
        self.check_budget(need, &format!("a {width}x{height} image"))
    }

    /// Refuses `what`, needing `need` bytes, when they would pass the cap.
    fn check_budget(&self, need: u64, what: &str) -> Out<()> {
        let left = self.ops_budget() as u64;
        if need > left {
            return Err(wit_err(Error::unavailable(format!("{what} needs {need} bytes, more than the {left} bytes left under the plugin's memory cap (max_memory_bytes)")).for_model(&self.model)));
        }
        Ok(())
    }
}
