//! Tests for config parsing, rendering and validation, including a corpus of
//! real-world Triton configs (`testdata/`).

use super::defaults::normalize;
use super::pb::model_config::SchedulingChoice;
use super::pb::model_instance_group::Kind;
use super::support::{check_supported, not_acted_on};
use super::text::add_list_colons;
use super::validate::validate;
use super::*;

const CORPUS: &[(&str, &str)] = &[
    ("bert", include_str!("testdata/bert.pbtxt")),
    ("gpt", include_str!("testdata/gpt.pbtxt")),
    (
        "inception_savedmodel",
        include_str!("testdata/savedmodel.pbtxt"),
    ),
    ("bls_sync", include_str!("testdata/python_bls.pbtxt")),
    ("ensemble_model", include_str!("testdata/ensemble.pbtxt")),
    ("simple_sequence", include_str!("testdata/sequence.pbtxt")),
];

#[test]
fn corpus_parses_and_validates() {
    for (name, text) in CORPUS {
        let mut cfg = parse_pbtxt(text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(&cfg.name, name);
        normalize(&mut cfg, 0);
        validate(&cfg, name).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn bert_fields() {
    let cfg = parse_pbtxt(CORPUS[0].1).unwrap();
    assert_eq!(cfg.max_batch_size, 16);
    assert_eq!(cfg.input.len(), 3);
    assert!(cfg
        .input
        .iter()
        .all(|i| i.data_type == pb::DataType::TypeInt64 as i32 && i.dims == [128]));
    assert_eq!(cfg.instance_group[0].kind, Kind::Gpu as i32);
    assert_eq!(cfg.instance_group[0].gpus, [0]);
    match cfg.scheduling_choice {
        Some(SchedulingChoice::DynamicBatching(db)) => {
            assert_eq!(db.preferred_batch_size, [4, 8]);
            assert_eq!(db.max_queue_delay_microseconds, 100);
        }
        other => panic!("unexpected scheduling {other:?}"),
    }
}

#[test]
fn gpt_parameters_and_reshape() {
    let cfg = parse_pbtxt(CORPUS[1].1).unwrap();
    assert_eq!(cfg.parameters["INFERENCE_MODE"].string_value, "GPT");
    assert_eq!(cfg.parameters["tensor_para_size"].string_value, "1");
    assert_eq!(
        cfg.input[1].reshape.as_ref().unwrap().shape,
        Vec::<i64>::new()
    );
    assert!(cfg.input[3].optional);
    assert!(!cfg.model_transaction_policy.as_ref().unwrap().decoupled);
}

#[test]
fn savedmodel_optimization_and_policy() {
    let cfg = parse_pbtxt(CORPUS[2].1).unwrap();
    let opt = cfg.optimization.as_ref().unwrap();
    let acc = &opt
        .execution_accelerators
        .as_ref()
        .unwrap()
        .gpu_execution_accelerator[0];
    assert_eq!(acc.name, "tensorrt");
    assert_eq!(acc.parameters["precision_mode"], "FP16");
    assert!(opt.cuda.as_ref().unwrap().graphs);
    assert_eq!(cfg.model_warmup[0].inputs["input"].dims, [299, 299, 3]);
    let fields = not_acted_on(&cfg);
    // cuda { graphs } is not acted on; execution_accelerators are.
    assert!(
        fields.contains(&"optimization (other than graph.level and execution_accelerators)")
            && !fields.contains(&"model_warmup")
    );
}

#[test]
fn sequence_batching_and_decoupled_models_pass_the_config_checks() {
    let mut cfg = parse_pbtxt(CORPUS[5].1).unwrap();
    assert!(check_supported(&cfg).is_ok());
    normalize(&mut cfg, 0);
    let sb = crate::sequence::batching(&cfg).unwrap();
    assert_eq!(sb.max_sequence_idle_microseconds, 5_000_000);
    let names: Vec<_> = crate::sequence::extra_inputs(&cfg)
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["START", "CORRID", "INPUT_STATE"]);
    // Whether its backend can serve a decoupled model is decided at load.
    let decoupled =
        parse_pbtxt("name: \"d\" model_transaction_policy { decoupled: true }").unwrap();
    assert!(check_supported(&decoupled).is_ok());
    let ensemble = parse_pbtxt(CORPUS[4].1).unwrap();
    assert!(check_supported(&ensemble).is_ok());
}

#[test]
fn sequence_configs_get_tritons_messages() {
    let seq = |body: &str| {
        checked(&format!(
            "name: \"m\" max_batch_size: 2 input [{{name: \"X\" data_type: TYPE_INT32 dims: [1]}}] \
             sequence_batching {{ {body} }}"
        ))
        .map_err(|e| e.message)
    };
    assert!(seq("").is_ok());
    let ctl =
        |name: &str, c: &str| format!("control_input [{{name: \"{name}\" control [{{{c}}}]}}]");
    let cases = [
        (
            ctl("S", "kind: CONTROL_SEQUENCE_START"),
            "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for CONTROL_SEQUENCE_START for m",
        ),
        (
            ctl("S", "kind: CONTROL_SEQUENCE_START int32_false_true: [0]"),
            "sequence batching control 'int32_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_START for m",
        ),
        (
            ctl("S", "kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1] fp32_false_true: [0, 1]"),
            "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and 'bool_false_true' for CONTROL_SEQUENCE_READY for m",
        ),
        (
            ctl("C", "kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32"),
            "unexpected data type for control CONTROL_SEQUENCE_CORRID for m. Allowed data types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
        ),
        (
            ctl("X", "kind: CONTROL_SEQUENCE_END bool_false_true: [false, true]"),
            "model 'm': 'X' is both a model input and a sequence batching control or state input; remove it from 'input'",
        ),
        (
            "control_input [{name: \"A\" control [{kind: CONTROL_SEQUENCE_END int32_false_true: [0, 1]}]}, \
             {name: \"B\" control [{kind: CONTROL_SEQUENCE_END int32_false_true: [0, 1]}]}]"
                .to_string(),
            "sequence batching specifies multiple CONTROL_SEQUENCE_END tensors for m",
        ),
        (
            "oldest { preferred_batch_size: [3] }".to_string(),
            "sequence batching preferred batch size must be <= max batch size for m",
        ),
        (
            "state [{input_name: \"I\" output_name: \"O\" data_type: TYPE_FP32 dims: [2] \
             initial_state {data_type: TYPE_FP32 dims: [3] zero_data: true name: \"z\"}}]"
                .to_string(),
            "'initial_state' dim for input name 'I' doesn't match 'state' dim description. 3 != 2",
        ),
        (
            "state [{input_name: \"I\" output_name: \"O\" data_type: TYPE_FP32 dims: [2] \
             initial_state {data_type: TYPE_INT32 dims: [2] zero_data: true name: \"z\"}}]"
                .to_string(),
            "The data type used for 'initial_state' field of state 'I' does not match the state data type.",
        ),
        (
            "state [{input_name: \"I\" output_name: \"O\" data_type: TYPE_FP32 dims: [2] \
             initial_state {data_type: TYPE_FP32 dims: [2] data_file: \"../../etc/passwd\" name: \"z\"}}]"
                .to_string(),
            "model 'm': initial_state data_file '../../etc/passwd' of state 'I' must be a relative path inside the model's initial_state folder",
        ),
    ];
    for (body, want) in cases {
        assert_eq!(seq(&body).unwrap_err(), want, "{body}");
    }
}

#[test]
fn parse_errors_are_clear() {
    let e = parse_pbtxt("name: \"x\"\nmax_batch_sise: 4\n").unwrap_err();
    assert!(e.message.contains("max_batch_sise"), "{e}");
    let e = parse_pbtxt("name: \"x\" input [ { data_type: TYPE_FLOAT } ]").unwrap_err();
    assert!(e.message.contains("TYPE_FLOAT"), "{e}");
}

fn checked(text: &str) -> crate::error::Result<()> {
    let mut cfg = parse_pbtxt(text)?;
    normalize(&mut cfg, 0);
    validate(&cfg, "m")
}

#[test]
fn validation_errors_name_model_and_field() {
    let io = "input [{name: \"a\" data_type: TYPE_FP32 dims: [4]}] output [{name: \"b\" data_type: TYPE_FP32 dims: [4]}]";
    assert!(checked(&format!("name: \"m\" {io}")).is_ok());
    let e = checked(&format!("name: \"other\" {io}")).unwrap_err();
    assert!(
        e.message
            .contains("does not match the model directory name 'm'"),
        "{e}"
    );
    let e = checked(&format!("name: \"m\" max_batch_size: -1 {io}")).unwrap_err();
    assert!(e.message.contains("max_batch_size must be >= 0"), "{e}");
    // File names stay inside the model's folder.
    let label = |f: &str| {
        checked(&format!("name: \"m\" input [{{name: \"a\" data_type: TYPE_FP32 dims: [4]}}] output [{{name: \"b\" data_type: TYPE_FP32 dims: [4] label_filename: \"{f}\"}}]"))
    };
    assert!(label("labels.txt").is_ok() && label("sub/labels.txt").is_ok());
    for bad in ["/etc/passwd", "../../etc/passwd", "a/../../b"] {
        let e = label(bad).unwrap_err();
        assert!(
            e.message.contains(&format!(
                "label_filename '{bad}' must be a relative path inside the model's folder"
            )),
            "{e}"
        );
    }
    let e = checked(&format!(
        "name: \"m\" default_model_filename: \"../x.onnx\" {io}"
    ))
    .unwrap_err();
    assert!(
        e.message.contains("default_model_filename '../x.onnx'"),
        "{e}"
    );
    let e = checked(&format!(
        "name: \"m\" cc_model_filenames {{ key: \"8.7\" value: \"/x\" }} {io}"
    ))
    .unwrap_err();
    assert!(e.message.contains("cc_model_filenames '/x'"), "{e}");
    let e = checked("name: \"m\" input [{name: \"a\" data_type: TYPE_FP32}]").unwrap_err();
    assert!(
        e.message
            .contains("model 'm' input 'a': dims must not be empty"),
        "{e}"
    );
    let e =
        checked("name: \"m\" input [{name: \"a\" data_type: TYPE_FP32 dims: [0]}]").unwrap_err();
    assert!(e.message.contains("each dim must be >= 1 or -1"), "{e}");
    let e = checked(
        "name: \"m\" input [{name: \"a\" data_type: TYPE_FP32 dims: [4] reshape: {shape: [3]}}]",
    )
    .unwrap_err();
    assert!(e.message.contains("different element count"), "{e}");
    assert!(checked(
        "name: \"m\" input [{name: \"a\" data_type: TYPE_FP32 dims: [2,3] reshape: {shape: [6]}}]"
    )
    .is_ok());
    let e = checked("name: \"m\" input [{name: \"a\" data_type: TYPE_FP32 dims: [4]}, {name: \"a\" data_type: TYPE_FP32 dims: [4]}]").unwrap_err();
    assert!(
        e.message.contains("input 'a' is declared more than once"),
        "{e}"
    );
    let e = checked("name: \"m\" output [{name: \"o\" dims: [4]}]").unwrap_err();
    assert!(
        e.message.contains("data_type TYPE_INVALID is not valid"),
        "{e}"
    );
    let e = checked("name: \"m\" version_policy: { specific: { versions: [] } }").unwrap_err();
    assert!(e.message.contains("versions must not be empty"), "{e}");
    let e = checked("name: \"m\" version_policy: { latest: { num_versions: 0 } }").unwrap_err();
    assert!(e.message.contains("num_versions must be >= 1"), "{e}");
    let e = checked("name: \"m\" max_batch_size: 4 dynamic_batching { preferred_batch_size: [8] }")
        .unwrap_err();
    assert!(e.message.contains("preferred_batch_size 8"), "{e}");
}

#[test]
fn huge_dims_are_errors_not_overflows() {
    let cfg = parse_pbtxt(
        "name: \"m\" input [{name: \"a\" data_type: TYPE_FP32 dims: [9223372036854775807, 4] reshape: {shape: [9223372036854775807, 4]}}]",
    )
    .unwrap();
    assert!(validate(&cfg, "m").is_err());
}

#[test]
fn normalize_fills_triton_defaults() {
    let mut cfg = parse_pbtxt("name: \"m\"").unwrap();
    normalize(&mut cfg, 0);
    assert_eq!(cfg.instance_group.len(), 1);
    assert_eq!(
        cfg.instance_group[0].name, "m",
        "Triton names the added group after the model"
    );
    assert_eq!(cfg.instance_group[0].count, 1);
    assert_eq!(cfg.instance_group[0].kind, Kind::Cpu as i32);
    assert!(matches!(
        cfg.version_policy.clone().unwrap().policy_choice,
        Some(pb::model_version_policy::PolicyChoice::Latest(
            pb::model_version_policy::Latest { num_versions: 1 }
        ))
    ));
    let v = json::to_json(&cfg);
    assert!(
        v.get("model_transaction_policy").is_none(),
        "Triton adds a transaction policy to ensembles only"
    );
    assert_eq!(v["optimization"]["input_pinned_memory"]["enable"], true);
    assert_eq!(v["optimization"]["output_pinned_memory"]["enable"], true);
    assert!(not_acted_on(&cfg).is_empty());
    let mut cfg = parse_pbtxt("name: \"m\" max_batch_size: 8 dynamic_batching { }").unwrap();
    normalize(&mut cfg, 0);
    let v = json::to_json(&cfg);
    assert_eq!(
        v["dynamic_batching"]["preferred_batch_size"],
        serde_json::json!([8])
    );
    let mut cfg = parse_pbtxt("name: \"e\" platform: \"ensemble\"").unwrap();
    normalize(&mut cfg, 0);
    assert!(cfg.optimization.is_none(), "ensembles take no optimization");
    assert!(cfg.model_transaction_policy.is_some());
}

#[test]
fn json_follows_triton_conventions() {
    let mut cfg = parse_pbtxt(CORPUS[0].1).unwrap();
    normalize(&mut cfg, 0);
    let v = json::to_json(&cfg);
    assert_eq!(v["name"], "bert");
    assert_eq!(v["max_batch_size"], 16);
    assert_eq!(v["input"][0]["data_type"], "TYPE_INT64");
    assert_eq!(v["input"][0]["dims"], serde_json::json!([128]));
    assert_eq!(v["input"][0]["format"], "FORMAT_NONE");
    assert_eq!(v["input"][0]["optional"], false);
    assert_eq!(v["backend"], "");
    assert_eq!(v["dynamic_batching"]["max_queue_delay_microseconds"], 100);
    assert_eq!(v["version_policy"]["latest"]["num_versions"], 1);
    assert_eq!(v["instance_group"][0]["kind"], "KIND_GPU");
    let back = json::from_json(&v.to_string()).unwrap();
    assert_eq!(back, cfg);
}

#[test]
fn pbtxt_round_trip() {
    for (name, text) in CORPUS {
        let cfg = parse_pbtxt(text).unwrap();
        assert_eq!(parse_pbtxt(&to_pbtxt(&cfg)).unwrap(), cfg, "{name}");
    }
}

#[test]
fn list_colon_is_optional_outside_strings() {
    assert_eq!(
        add_list_colons("input [ {name: \"a [b\"} ] # c [d\ndims: [1]"),
        (
            "input :[ {name: \"a [b\"} ] # c [d\ndims: [1]".to_string(),
            vec![6]
        )
    );
}

#[test]
fn parse_errors_say_where_and_suggest_the_name() {
    let e = parse_pbtxt("name: \"m\"\nmax_batch_sizes: 8\n").unwrap_err();
    assert_eq!(
        e.message,
        "failed to parse config.pbtxt at line 2, column 1: field 'max_batch_sizes' not found for message \
         'inference.ModelConfig' (did you mean 'max_batch_size'?)"
    );
    // After inserted list colons, positions still refer to the file as written.
    let e =
        parse_pbtxt("name: \"m\"\ninput [ { name: \"I\" data_type: TYPE_FLOAT32 dims: [ 1 ] } ]\n")
            .unwrap_err();
    assert_eq!(
        e.message,
        "failed to parse config.pbtxt at line 2, column 32: value 'TYPE_FLOAT32' was not found for enum \
         'inference.DataType' (did you mean 'TYPE_FP32'?)"
    );
    let e = parse_pbtxt("input [ { nme: \"I\" } ]").unwrap_err();
    assert!(e.message.contains("at line 1, column 11"), "{}", e.message);
    assert!(
        e.message.contains("(did you mean 'name'?)"),
        "{}",
        e.message
    );
    // Nothing close: no guess.
    let e = parse_pbtxt("zzzz: 1").unwrap_err();
    assert!(!e.message.contains("did you mean"), "{}", e.message);
    let e = parse_pbtxt("name: \"m\"\nmax_batch_size: 8 8").unwrap_err();
    assert!(e.message.contains("at line 2, column 19"), "{}", e.message);
}

/// Mutated corpus configs (bytes deleted, duplicated, replaced by pbtxt
/// tokens) must come back as `Ok` or `Err` from parse / normalize / validate /
/// JSON round trip, never panic: a broken config.pbtxt fails its model only.
#[test]
fn mutated_configs_never_panic() {
    const TOKENS: &[&str] = &[
        "-1",
        "0",
        "-9223372036854775808",
        "99999999999999999999",
        "[",
        "]",
        "{",
        "}",
        ":",
        "\"",
        "dims: [ -5 ]",
        "max_batch_size: -3",
        "count: -1",
        "KIND_GPU",
        "TYPE_STRING",
        "reshape { shape: [ ] }",
        "preferred_batch_size: [ 0 ]",
        "max_queue_delay_microseconds: 18446744073709551615",
        "\\",
        "#",
        "\n",
    ];
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n.max(1) as u64) as usize
    };
    for (name, text) in CORPUS {
        for _ in 0..400 {
            let mut s = text.to_string();
            for _ in 0..1 + next(3) {
                let at = s.floor_char_boundary(next(s.len()));
                let end = s.floor_char_boundary((at + next(12)).min(s.len()));
                match next(3) {
                    0 => s.replace_range(at..end, ""),
                    1 => {
                        let copy = s[at..end].to_string();
                        s.insert_str(at, &copy)
                    }
                    _ => s.replace_range(at..end, TOKENS[next(TOKENS.len())]),
                }
            }
            let Ok(mut cfg) = std::panic::catch_unwind(|| parse_pbtxt(&s))
                .unwrap_or_else(|_| panic!("{name}: parse panicked on:\n{s}"))
            else {
                continue;
            };
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                normalize(&mut cfg, 1);
                let _ = validate(&cfg, name);
                let _ = check_supported(&cfg);
                let _ = json::from_json(&json::to_json(&cfg).to_string());
                let _ = parse_pbtxt(&to_pbtxt(&cfg));
            }));
            assert!(outcome.is_ok(), "{name}: panicked on:\n{s}");
        }
    }
}

#[test]
fn the_response_cache_is_refused_for_sequence_and_decoupled_models() {
    let base = r#"name: "m" backend: "identity" max_batch_size: 4
        input [{name: "X" data_type: TYPE_INT32 dims: [2]}]
        output [{name: "Y" data_type: TYPE_INT32 dims: [2]}]
        response_cache { enable: true }"#;
    let ok = parse_pbtxt(base).unwrap();
    validate(&ok, "m").unwrap();
    let seq = parse_pbtxt(&format!("{base} sequence_batching {{}}")).unwrap();
    assert_eq!(
        validate(&seq, "m").unwrap_err().message,
        "Response Cache does not currently support model m with sequence batching scheduler. Please disable the response cache."
    );
    let dec = parse_pbtxt(&format!(
        "{base} model_transaction_policy {{ decoupled: true }}"
    ))
    .unwrap();
    let e = validate(&dec, "m").unwrap_err();
    assert_eq!(e.code, crate::error::Code::InvalidArg);
    assert!(
        e.message.contains("with 'decoupled' transaction policy"),
        "{e}"
    );
    let off = parse_pbtxt(
        &format!("{base} model_transaction_policy {{ decoupled: true }}")
            .replace("enable: true", "enable: false"),
    )
    .unwrap();
    validate(&off, "m").unwrap();
}
