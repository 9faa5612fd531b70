//! Tensor maths on [`Array`]s: element-wise binary operations with numpy
//! broadcasting, scalar and unary operations, clipping, softmax,
//! reductions, argmax and top-k.

use tern_core::error::{Error, Result};
use tern_core::DataType;

use crate::array::{around, check_axis, count, for_each_pair, strides, Array};

/// Element-wise binary operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
    /// The larger of the two.
    Maximum,
    /// The smaller of the two.
    Minimum,
    /// `a ** b`.
    Pow,
}

impl BinaryOp {
    fn apply(self, a: f64, b: f64) -> f64 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Maximum => a.max(b),
            BinaryOp::Minimum => a.min(b),
            BinaryOp::Pow => a.powf(b),
        }
    }
}

/// Element-wise unary operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryOp {
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// `e^x`.
    Exp,
    /// Natural logarithm.
    Log,
    /// Absolute value.
    Abs,
    /// `-x`.
    Neg,
    /// Square root.
    Sqrt,
    /// Hyperbolic tangent.
    Tanh,
    /// Round half to even (numpy's `round`).
    Round,
    /// Round down.
    Floor,
    /// Round up.
    Ceil,
}

impl UnaryOp {
    fn apply(self, x: f64) -> f64 {
        match self {
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Abs => x.abs(),
            UnaryOp::Neg => -x,
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Round => x.round_ties_even(),
            UnaryOp::Floor => x.floor(),
            UnaryOp::Ceil => x.ceil(),
        }
    }
}

/// Reductions along an axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Arithmetic mean.
    Mean,
    /// Largest element.
    Max,
    /// Smallest element.
    Min,
}

/// The float type results of mixed operations get: FP64 if either side is,
/// else FP32.
fn float_result(a: DataType, b: DataType) -> DataType {
    if a == DataType::Fp64 || b == DataType::Fp64 {
        DataType::Fp64
    } else {
        DataType::Fp32
    }
}

/// Numpy's broadcast of two shapes.
pub fn broadcast(a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let rank = a.len().max(b.len());
    let dim = |s: &[usize], i: usize| {
        let pad = rank - s.len();
        if i < pad {
            1
        } else {
            s[i - pad]
        }
    };
    (0..rank)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y => Ok(x),
            (1, y) => Ok(y),
            (x, 1) => Ok(x),
            _ => Err(Error::invalid_arg(format!(
                "shapes {a:?} and {b:?} cannot be broadcast together"
            ))),
        })
        .collect()
}

/// Source strides of `shape` read as the broadcast `out` shape (0 on
/// broadcast axes).
fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let pad = out.len() - shape.len();
    let own = strides(shape);
    (0..out.len())
        .map(|i| {
            if i < pad || shape[i - pad] == 1 {
                0
            } else {
                own[i - pad]
            }
        })
        .collect()
}

/// `a op b` with numpy broadcasting. The result is floating point when
/// either side is (FP32 unless one is FP64) and for `div` of integers,
/// else `a`'s type.
pub fn binary(op: BinaryOp, a: &Array, b: &Array) -> Result<Array> {
    let shape = broadcast(a.shape(), b.shape())?;
    count(&shape)?;
    let dtype = if a.is_float() || b.is_float() || op == BinaryOp::Div {
        if a.is_float() && !b.is_float() {
            a.dtype()
        } else if b.is_float() && !a.is_float() {
            b.dtype()
        } else {
            float_result(a.dtype(), b.dtype())
        }
    } else {
        a.dtype()
    };
    let (sa, sb) = (
        broadcast_strides(a.shape(), &shape),
        broadcast_strides(b.shape(), &shape),
    );
    let n = shape.iter().product();
    let pairs = Pairs {
        shape: &shape,
        sa: &sa,
        sb: &sb,
        n,
    };
    if dtype == DataType::Fp32 && a.dtype() == DataType::Fp32 && b.dtype() == DataType::Fp32 {
        // The same values as the general path (computed in f64, rounded
        // once: for + - * / that is the correctly rounded f32 result),
        // without widening both operands first.
        let (x, y) = (a.to_f32(), b.to_f32());
        // One loop per operation, so that each inlines its arithmetic.
        let out = match op {
            BinaryOp::Add => pairs.map(&x, &y, |p, q| (p as f64 + q as f64) as f32),
            BinaryOp::Sub => pairs.map(&x, &y, |p, q| (p as f64 - q as f64) as f32),
            BinaryOp::Mul => pairs.map(&x, &y, |p, q| (p as f64 * q as f64) as f32),
            BinaryOp::Div => pairs.map(&x, &y, |p, q| (p as f64 / q as f64) as f32),
            _ => pairs.map(&x, &y, |p, q| op.apply(p as f64, q as f64) as f32),
        };
        return Ok(Array::from_f32(shape, &out));
    }
    let (x, y) = (a.to_f64(), b.to_f64());
    let out = pairs.map(&x, &y, |p, q| op.apply(p, q));
    Array::from_f64(dtype, shape, &out)
}

/// The element pairs of a broadcast binary operation: the output `shape`
/// (`n` elements) and each operand's strides on it.
struct Pairs<'a> {
    shape: &'a [usize],
    sa: &'a [usize],
    sb: &'a [usize],
    n: usize,
}

impl Pairs<'_> {
    /// `f` of every pair, in C order of the output.
    fn map<T: Copy, U>(&self, x: &[T], y: &[T], f: impl Fn(T, T) -> U) -> Vec<U> {
        if x.len() == self.n && y.len() == self.n {
            // No broadcasting: both operands are laid out as the output.
            return x.iter().zip(y).map(|(&p, &q)| f(p, q)).collect();
        }
        // Row by row along the last axis, whose strides (1 or 0 when
        // broadcast) decide the loop.
        let r = self.shape.len();
        let (len, ia, ib) = match r {
            0 => (1, 0, 0),
            _ => (self.shape[r - 1], self.sa[r - 1], self.sb[r - 1]),
        };
        let outer = r.saturating_sub(1);
        let mut out = Vec::with_capacity(self.n);
        for_each_pair(
            &self.shape[..outer],
            &self.sa[..outer],
            &self.sb[..outer],
            |a, b| match (ia, ib) {
                (1, 1) => out.extend(
                    x[a..a + len]
                        .iter()
                        .zip(&y[b..b + len])
                        .map(|(&p, &q)| f(p, q)),
                ),
                (1, 0) => {
                    let q = y[b];
                    out.extend(x[a..a + len].iter().map(|&p| f(p, q)))
                }
                (0, 1) => {
                    let p = x[a];
                    out.extend(y[b..b + len].iter().map(|&q| f(p, q)))
                }
                _ => out.extend((0..len).map(|i| f(x[a + i * ia], y[b + i * ib]))),
            },
        );
        out
    }
}

/// `a op value` for every element; integer arrays give FP32 when `value`
/// is not a whole number or `op` is `div`.
pub fn scalar(op: BinaryOp, a: &Array, value: f64) -> Result<Array> {
    let dtype = if !a.is_float() && (value.fract() != 0.0 || op == BinaryOp::Div) {
        DataType::Fp32
    } else {
        a.dtype()
    };
    if a.dtype() == DataType::Fp32 {
        let x = a.to_f32();
        // One loop per operation, so that each inlines its arithmetic (the
        // same values: computed in f64, rounded once).
        let v: Vec<f32> = match op {
            BinaryOp::Add => x.iter().map(|&p| (p as f64 + value) as f32).collect(),
            BinaryOp::Sub => x.iter().map(|&p| (p as f64 - value) as f32).collect(),
            BinaryOp::Mul => x.iter().map(|&p| (p as f64 * value) as f32).collect(),
            BinaryOp::Div => x.iter().map(|&p| (p as f64 / value) as f32).collect(),
            _ => x
                .iter()
                .map(|&p| op.apply(p as f64, value) as f32)
                .collect(),
        };
        return Ok(Array::from_f32(a.shape().to_vec(), &v));
    }
    let v: Vec<f64> = a.to_f64().into_iter().map(|x| op.apply(x, value)).collect();
    Array::from_f64(dtype, a.shape().to_vec(), &v)
}

/// A function of every element (integer arrays give FP32).
pub fn unary(op: UnaryOp, a: &Array) -> Result<Array> {
    let dtype = if a.is_float() {
        a.dtype()
    } else {
        DataType::Fp32
    };
    let v: Vec<f64> = a.to_f64().into_iter().map(|x| op.apply(x)).collect();
    Array::from_f64(dtype, a.shape().to_vec(), &v)
}

/// Every element clamped into `[low, high]`.
pub fn clip(a: &Array, low: f64, high: f64) -> Result<Array> {
    if low > high || low.is_nan() || high.is_nan() {
        return Err(Error::invalid_arg(format!(
            "clip: low {low} must not be above high {high}"
        )));
    }
    let v: Vec<f64> = a.to_f64().into_iter().map(|x| x.clamp(low, high)).collect();
    Array::from_f64(a.dtype(), a.shape().to_vec(), &v)
}

/// Softmax along `axis` (FP64 arrays stay FP64, everything else gives FP32).
pub fn softmax(a: &Array, axis: usize) -> Result<Array> {
    check_axis(axis, a.shape().len())?;
    let (outer, n, inner) = around(a.shape(), axis);
    let mut v = a.to_f64();
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * n + j) * inner + i;
            let max = (0..n).map(|j| v[at(j)]).fold(f64::NEG_INFINITY, f64::max);
            let mut sum = 0.0;
            for j in 0..n {
                let e = (v[at(j)] - max).exp();
                v[at(j)] = e;
                sum += e;
            }
            for j in 0..n {
                v[at(j)] /= sum;
            }
        }
    }
    let dtype = if a.dtype() == DataType::Fp64 {
        DataType::Fp64
    } else {
        DataType::Fp32
    };
    Array::from_f64(dtype, a.shape().to_vec(), &v)
}

fn without_axis(shape: &[usize], axis: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    s.remove(axis);
    s
}

/// Reduces `axis`, which is removed from the shape. Sums and means of
/// integers give FP64 values cast back to the type (`mean` gives FP32).
pub fn reduce(op: ReduceOp, a: &Array, axis: usize) -> Result<Array> {
    check_axis(axis, a.shape().len())?;
    let (outer, n, inner) = around(a.shape(), axis);
    if n == 0 && matches!(op, ReduceOp::Max | ReduceOp::Min) {
        return Err(Error::invalid_arg(format!(
            "cannot take the max or min of an empty axis {axis}"
        )));
    }
    let v = a.to_f64();
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let it = (0..n).map(|j| v[(o * n + j) * inner + i]);
            out.push(match op {
                ReduceOp::Sum => it.sum(),
                ReduceOp::Mean => it.sum::<f64>() / n as f64,
                ReduceOp::Max => it.fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Min => it.fold(f64::INFINITY, f64::min),
            });
        }
    }
    let dtype = match op {
        ReduceOp::Mean if !a.is_float() => DataType::Fp32,
        _ => a.dtype(),
    };
    Array::from_f64(dtype, without_axis(a.shape(), axis), &out)
}

/// Indices (INT64) of the largest element along `axis` (removed from the
/// shape); the first one on ties.
pub fn argmax(a: &Array, axis: usize) -> Result<Array> {
    check_axis(axis, a.shape().len())?;
    let (outer, n, inner) = around(a.shape(), axis);
    if n == 0 {
        return Err(Error::invalid_arg(format!(
            "cannot take the argmax of an empty axis {axis}"
        )));
    }
    let v = a.to_f64();
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let mut best = 0;
            for j in 1..n {
                if v[(o * n + j) * inner + i] > v[(o * n + best) * inner + i] {
                    best = j;
                }
            }
            out.push(best as f64);
        }
    }
    Array::from_f64(DataType::Int64, without_axis(a.shape(), axis), &out)
}

/// The `k` largest elements along `axis`, largest first (the lower index
/// first on ties): values (in `a`'s type) and indices (INT64).
pub fn top_k(a: &Array, k: usize, axis: usize) -> Result<(Array, Array)> {
    check_axis(axis, a.shape().len())?;
    let (outer, n, inner) = around(a.shape(), axis);
    if k > n {
        return Err(Error::invalid_arg(format!(
            "top-k: k = {k} is larger than axis {axis} ({n} elements)"
        )));
    }
    let v = a.to_f64();
    let mut vals = vec![0.0; outer * k * inner];
    let mut idx = vec![0.0; outer * k * inner];
    let mut order: Vec<usize> = Vec::with_capacity(n);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * n + j) * inner + i;
            order.clear();
            order.extend(0..n);
            order.sort_by(|&x, &y| v[at(y)].total_cmp(&v[at(x)]).then(x.cmp(&y)));
            for (r, &j) in order.iter().take(k).enumerate() {
                vals[(o * k + r) * inner + i] = v[at(j)];
                idx[(o * k + r) * inner + i] = j as f64;
            }
        }
    }
    let mut shape = a.shape().to_vec();
    shape[axis] = k;
    Ok((
        Array::from_f64(a.dtype(), shape.clone(), &vals)?,
        Array::from_f64(DataType::Int64, shape, &idx)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arr(shape: Vec<usize>, v: &[f32]) -> Array {
        Array::from_f32(shape, v)
    }

    #[test]
    fn binary_matches_an_element_by_element_reference() {
        // Every broadcast pattern the row loops distinguish (same layout,
        // a scalar, a per-channel constant, a row, a column, both sides
        // stretched), FP32 and FP64 and an integer type, against numpy's
        // rule computed one index at a time.
        let cases: [(&[usize], &[usize]); 8] = [
            (&[2, 3, 4], &[2, 3, 4]),
            (&[2, 3, 4], &[]),
            (&[], &[2, 3, 4]),
            (&[1, 3, 2, 2], &[3, 1, 1]),
            (&[2, 3, 4], &[4]),
            (&[2, 3, 4], &[3, 1]),
            (&[3, 1], &[1, 4]),
            (&[2, 1, 1], &[1, 1]),
        ];
        for (sa, sb) in cases {
            for dtype in [DataType::Fp32, DataType::Fp64, DataType::Int32] {
                let fill = |shape: &[usize], k: f64| {
                    let v: Vec<f64> = (0..shape.iter().product::<usize>())
                        .map(|i| (i as f64 * k + 0.1).sin() * 100.0)
                        .collect();
                    let a = Array::from_f64(dtype, shape.to_vec(), &v).unwrap();
                    (a.to_f64(), a)
                };
                let ((xa, a), (xb, b)) = (fill(sa, 0.7), fill(sb, 1.3));
                let out = broadcast(sa, sb).unwrap();
                let (ta, tb) = (broadcast_strides(sa, &out), broadcast_strides(sb, &out));
                for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
                    let got = binary(op, &a, &b).unwrap();
                    assert_eq!(got.shape(), &out[..], "{sa:?} {sb:?}");
                    let mut want = Vec::new();
                    let n: usize = out.iter().product();
                    for k in 0..n {
                        // The index of output element k, then each operand's offset.
                        let (mut rest, mut ia, mut ib) = (k, 0, 0);
                        for axis in (0..out.len()).rev() {
                            let i = rest % out[axis];
                            rest /= out[axis];
                            ia += i * ta[axis];
                            ib += i * tb[axis];
                        }
                        want.push(op.apply(xa[ia], xb[ib]));
                    }
                    let want = Array::from_f64(got.dtype(), out.clone(), &want).unwrap();
                    assert_eq!(got.data(), want.data(), "{op:?} {dtype:?} {sa:?} {sb:?}");
                }
            }
        }
    }

    #[test]
    fn binary_broadcasts_like_numpy() {
        let a = arr(vec![2, 3], &[1., 2., 3., 4., 5., 6.]);
        let b = arr(vec![3], &[10., 20., 30.]);
        let c = binary(BinaryOp::Add, &a, &b).unwrap();
        assert_eq!(c.to_f32(), vec![11., 22., 33., 14., 25., 36.]);
        let col = arr(vec![2, 1], &[1., 2.]);
        let d = binary(BinaryOp::Mul, &a, &col).unwrap();
        assert_eq!(d.to_f32(), vec![1., 2., 3., 8., 10., 12.]);
        assert!(binary(BinaryOp::Add, &a, &arr(vec![2], &[1., 2.])).is_err());
    }

    #[test]
    fn fp32_scalar_matches_the_f64_rule() {
        // The FP32 loops give what every other type gets: the operation in
        // f64 on the widened element, rounded once.
        let v: Vec<f32> = (0..50).map(|i| ((i as f32) * 0.37).sin() * 300.0).collect();
        let a = arr(vec![5, 10], &v);
        let ops = [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Maximum,
            BinaryOp::Minimum,
            BinaryOp::Pow,
        ];
        for op in ops {
            for value in [255.0, 0.1f32 as f64, -3.0, 0.0] {
                let got = scalar(op, &a, value).unwrap();
                assert_eq!(got.shape(), &[5, 10]);
                let want: Vec<f32> = v
                    .iter()
                    .map(|&p| op.apply(p as f64, value) as f32)
                    .collect();
                let want = Array::from_f32(vec![5, 10], &want);
                assert_eq!(got.data(), want.data(), "{op:?} {value}");
            }
        }
    }

    #[test]
    fn integer_division_gives_floats() {
        let a = Array::new(DataType::Uint8, vec![2], vec![255u8, 51].into()).unwrap();
        let d = scalar(BinaryOp::Div, &a, 255.0).unwrap();
        assert_eq!(d.dtype(), DataType::Fp32);
        assert_eq!(d.to_f32(), vec![1.0, 0.2]);
        let s = scalar(BinaryOp::Add, &a, 1.0).unwrap();
        assert_eq!(s.dtype(), DataType::Uint8);
        // Results out of range saturate (C casts through double), they do not wrap.
        assert_eq!(&s.data()[..], &[255, 52]);
    }

    #[test]
    fn softmax_and_sigmoid() {
        let a = arr(vec![2, 2], &[0., 0., 1000., 0.]);
        let s = softmax(&a, 1).unwrap().to_f32();
        assert_eq!(s, vec![0.5, 0.5, 1.0, 0.0]);
        let g = unary(UnaryOp::Sigmoid, &arr(vec![1], &[0.])).unwrap();
        assert_eq!(g.to_f32(), vec![0.5]);
        assert!(softmax(&a, 2).is_err());
    }

    #[test]
    fn argmax_top_k_and_reduce() {
        let a = arr(vec![2, 4], &[1., 9., 9., 3., 7., 2., 8., 0.]);
        assert_eq!(argmax(&a, 1).unwrap().to_f64(), vec![1., 2.]);
        assert_eq!(argmax(&a, 0).unwrap().to_f64(), vec![1., 0., 0., 0.]);
        let (v, i) = top_k(&a, 2, 1).unwrap();
        assert_eq!(v.to_f32(), vec![9., 9., 8., 7.]);
        assert_eq!(i.to_f64(), vec![1., 2., 2., 0.]);
        assert_eq!(i.shape(), &[2, 2]);
        assert!(top_k(&a, 5, 1).is_err());
        assert_eq!(
            reduce(ReduceOp::Sum, &a, 1).unwrap().to_f32(),
            vec![22., 17.]
        );
        assert_eq!(
            reduce(ReduceOp::Mean, &a, 0).unwrap().to_f32(),
            vec![4., 5.5, 8.5, 1.5]
        );
        assert_eq!(reduce(ReduceOp::Min, &a, 1).unwrap().shape(), &[2]);
        assert!(argmax(&arr(vec![0], &[]), 0).is_err());
    }

    #[test]
    fn clip_checks_its_bounds() {
        let a = arr(vec![3], &[-2., 0.5, 9.]);
        assert_eq!(clip(&a, 0., 1.).unwrap().to_f32(), vec![0., 0.5, 1.]);
        assert!(clip(&a, 1., 0.).is_err());
    }
}
