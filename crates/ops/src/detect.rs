//! Detection post-processing: decoding YOLO outputs into boxes,
//! intersection over union and non-maximum suppression (greedy, as
//! OpenCV's `dnn.NMSBoxes` and torchvision's `nms`).

use tern_core::error::{Error, Result};

use crate::array::Array;

/// A box in pixel coordinates with its score and class.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Detection {
    /// Left.
    pub x1: f32,
    /// Top.
    pub y1: f32,
    /// Right.
    pub x2: f32,
    /// Bottom.
    pub y2: f32,
    /// Confidence.
    pub score: f32,
    /// Class index.
    pub class_id: u32,
    /// The anchor (row of the model output) the box was decoded from.
    pub anchor: u32,
}

/// Output layouts of YOLO detectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum YoloLayout {
    /// YOLOv8/v11: `[1, 4 + classes, anchors]`, no objectness.
    V8,
    /// YOLOv5/v7: `[1, anchors, 5 + classes]`, objectness in column 4.
    V5,
}

/// Decodes a YOLO output (centre x, centre y, width, height, then scores)
/// into the boxes whose best class score (times objectness for v5) is at
/// least `threshold`, in anchor order.
pub fn yolo_decode(output: &Array, layout: YoloLayout, threshold: f32) -> Result<Vec<Detection>> {
    let shape = output.shape();
    let (rows, cols) = match shape {
        [1, a, b] | [a, b] => (*a, *b),
        _ => {
            return Err(Error::invalid_arg(format!(
                "yolo-decode: expected an output of shape [1, rows, columns] for one image, got {shape:?}"
            )))
        }
    };
    if !output.is_float() {
        return Err(Error::invalid_arg(format!(
            "yolo-decode: the output must be floating point, got {}",
            output.dtype().wire_name()
        )));
    }
    let v = output.to_f32();
    // (features, anchors) and how to read feature f of anchor a.
    let (features, anchors, first_class) = match layout {
        YoloLayout::V8 => (rows, cols, 4),
        YoloLayout::V5 => (cols, rows, 5),
    };
    if features <= first_class {
        return Err(Error::invalid_arg(format!(
            "yolo-decode: {features} values per box leave no class scores ({layout:?} needs more than {first_class})"
        )));
    }
    let at = |f: usize, a: usize| match layout {
        YoloLayout::V8 => v[f * anchors + a],
        YoloLayout::V5 => v[a * features + f],
    };
    let mut out = Vec::new();
    for a in 0..anchors {
        let mut best = first_class;
        for f in first_class + 1..features {
            if at(f, a) > at(best, a) {
                best = f;
            }
        }
        let mut score = at(best, a);
        if layout == YoloLayout::V5 {
            score *= at(4, a);
        }
        if score >= threshold {
            let (cx, cy, w, h) = (at(0, a), at(1, a), at(2, a), at(3, a));
            out.push(Detection {
                x1: cx - w / 2.0,
                y1: cy - h / 2.0,
                x2: cx + w / 2.0,
                y2: cy + h / 2.0,
                score,
                class_id: (best - first_class) as u32,
                anchor: a as u32,
            });
        }
    }
    Ok(out)
}

/// Intersection over union of two boxes: 0 when they do not overlap, and
/// 1 when neither has any area (OpenCV's rule, so NMS keeps one of a pile
/// of boxes clipped to nothing).
pub fn iou(a: &Detection, b: &Detection) -> f32 {
    let area = |d: &Detection| (d.x2 - d.x1).max(0.0) * (d.y2 - d.y1).max(0.0);
    let (aa, ab) = (area(a), area(b));
    if aa + ab <= f32::EPSILON {
        return 1.0;
    }
    let w = (a.x2.min(b.x2) - a.x1.max(b.x1)).max(0.0);
    let h = (a.y2.min(b.y2) - a.y1.max(b.y1)).max(0.0);
    let inter = w * h;
    inter / (aa + ab - inter)
}

/// Greedy non-maximum suppression: indices of the boxes kept, best score
/// first (the earlier box on ties). Boxes whose score is not above
/// `score_threshold` are dropped (OpenCV's rule); a box overlapping a kept
/// one by more than `iou_threshold` is suppressed (only by one of its own
/// class when `class_aware`); at most `max_detections` are kept (0 = all).
pub fn nms(
    boxes: &[Detection],
    score_threshold: f32,
    iou_threshold: f32,
    max_detections: usize,
    class_aware: bool,
) -> Vec<u32> {
    let mut order: Vec<usize> = (0..boxes.len())
        .filter(|&i| boxes[i].score > score_threshold)
        .collect();
    order.sort_by(|&a, &b| boxes[b].score.total_cmp(&boxes[a].score).then(a.cmp(&b)));
    let mut kept: Vec<usize> = Vec::new();
    for i in order {
        if max_detections > 0 && kept.len() >= max_detections {
            break;
        }
        let suppressed = kept.iter().any(|&k| {
            (!class_aware || boxes[k].class_id == boxes[i].class_id)
                && iou(&boxes[k], &boxes[i]) > iou_threshold
        });
        if !suppressed {
            kept.push(i);
        }
    }
    kept.into_iter().map(|i| i as u32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn det(x1: f32, y1: f32, x2: f32, y2: f32, score: f32, class_id: u32) -> Detection {
        Detection {
            x1,
            y1,
            x2,
            y2,
            score,
            class_id,
            anchor: 0,
        }
    }

    #[test]
    fn decodes_v8_and_v5_layouts() {
        // v8: [1, 4 + 2 classes, 3 anchors].
        #[rustfmt::skip]
        let v8 = Array::from_f32(vec![1, 6, 3], &[
            10., 50., 0.,   // cx
            10., 50., 0.,   // cy
            4.,  10., 2.,   // w
            2.,  10., 2.,   // h
            0.9, 0.1, 0.05, // class 0
            0.2, 0.6, 0.1,  // class 1
        ]);
        let d = yolo_decode(&v8, YoloLayout::V8, 0.5).unwrap();
        assert_eq!(
            d,
            vec![
                det(8., 9., 12., 11., 0.9, 0),
                Detection {
                    anchor: 1,
                    ..det(45., 45., 55., 55., 0.6, 1)
                }
            ]
        );
        // v5: [1, 2 anchors, 5 + 2 classes].
        #[rustfmt::skip]
        let v5 = Array::from_f32(vec![1, 2, 7], &[
            10., 10., 4., 2., 0.5, 0.9, 0.1,
            50., 50., 10., 10., 1.0, 0.2, 0.6,
        ]);
        let d = yolo_decode(&v5, YoloLayout::V5, 0.5).unwrap();
        assert_eq!(
            d,
            vec![Detection {
                anchor: 1,
                ..det(45., 45., 55., 55., 0.6, 1)
            }]
        );
        assert!(yolo_decode(
            &Array::from_f32(vec![2, 6, 3], &[0.; 36]),
            YoloLayout::V8,
            0.5
        )
        .is_err());
        assert!(yolo_decode(
            &Array::from_f32(vec![1, 4, 3], &[0.; 12]),
            YoloLayout::V8,
            0.5
        )
        .is_err());
    }

    #[test]
    fn iou_of_overlapping_disjoint_and_empty_boxes() {
        let a = det(0., 0., 2., 2., 1., 0);
        assert_eq!(iou(&a, &det(1., 0., 3., 2., 1., 0)), 2.0 / 6.0);
        assert_eq!(iou(&a, &det(5., 5., 6., 6., 1., 0)), 0.0);
        // Two boxes without area are the same box (OpenCV), one is not.
        let empty = det(300., 2., 300., 190., 1., 0);
        assert_eq!(iou(&empty, &det(300., 50., 300., 60., 1., 0)), 1.0);
        assert_eq!(iou(&empty, &a), 0.0);
    }

    #[test]
    fn nms_keeps_the_best_and_respects_classes_and_limits() {
        let boxes = vec![
            det(0., 0., 10., 10., 0.8, 0),
            det(1., 1., 11., 11., 0.9, 0),
            det(1., 1., 11., 11., 0.7, 1),
            det(50., 50., 60., 60., 0.3, 0),
            det(80., 80., 90., 90., 0.1, 0),
        ];
        assert_eq!(nms(&boxes, 0.25, 0.45, 0, false), vec![1, 3]);
        assert_eq!(nms(&boxes, 0.25, 0.45, 0, true), vec![1, 2, 3]);
        assert_eq!(nms(&boxes, 0.25, 0.45, 1, true), vec![1]);
        assert_eq!(nms(&boxes, 0.0, 0.99, 0, false), vec![1, 0, 3, 4]);
        assert_eq!(nms(&boxes, 0.0, 0.99, 0, true), vec![1, 0, 2, 3, 4]);
        // OpenCV keeps only scores above the threshold.
        assert_eq!(nms(&boxes, 0.3, 0.45, 0, false), vec![1]);
    }
}
