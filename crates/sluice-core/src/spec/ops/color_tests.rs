//! Bounds of the colour ops: each bad parameter is refused with its field named.

use super::*;

/// `decode, <op>, center_crop 8`, parsed from JSON like a spec file's op list.
fn ops_with(op: &str) -> Vec<OpSpec> {
    let op: OpSpec = serde_json::from_str(op).unwrap();
    vec![OpSpec::Decode, op, OpSpec::CenterCrop { size: Size::square(8) }]
}

fn field_of(op: &str) -> String {
    validate_ops(&ops_with(op)).unwrap_err().field
}

#[test]
fn colour_ops_parse_with_torchvision_defaults_and_validate() {
    for op in [
        r#"{"op": "color_jitter", "brightness": 0.4, "contrast": [0.6, 1.4], "saturation": 0.4, "hue": 0.1}"#,
        r#"{"op": "color_jitter"}"#,
        r#"{"op": "random_grayscale"}"#,
        r#"{"op": "grayscale"}"#,
        r#"{"op": "solarize", "threshold": 128}"#,
        r#"{"op": "posterize", "bits": 4, "p": 0.5}"#,
        r#"{"op": "equalize"}"#,
        r#"{"op": "autocontrast", "p": 0.5}"#,
        r#"{"op": "adjust_sharpness", "sharpness_factor": 2}"#,
        r#"{"op": "gaussian_blur", "kernel_size": [3, 5]}"#,
    ] {
        validate_ops(&ops_with(op)).unwrap_or_else(|e| panic!("{op}: {e}"));
        // Written back as JSON, the op reads back the same (the spec fuzz target checks this).
        let parsed: OpSpec = serde_json::from_str(op).unwrap();
        let json = serde_json::to_string(&parsed).unwrap();
        assert_eq!(serde_json::from_str::<OpSpec>(&json).unwrap(), parsed, "{json}");
    }
    let parsed: OpSpec = serde_json::from_str(r#"{"op": "random_grayscale"}"#).unwrap();
    assert_eq!(parsed, OpSpec::RandomGrayscale { p: 0.1 });
    let parsed: OpSpec = serde_json::from_str(r#"{"op": "gaussian_blur", "kernel_size": 3}"#).unwrap();
    assert_eq!(parsed, OpSpec::GaussianBlur { kernel_size: KernelSize::One(3), sigma: Range::Two([0.1, 2.0]) });
    let parsed: OpSpec = serde_json::from_str(r#"{"op": "random_erasing", "value": "random"}"#).unwrap();
    let OpSpec::RandomErasing { p, scale, ratio, value } = parsed else { panic!("{parsed:?}") };
    assert_eq!((p, scale, ratio, value), (0.5, [0.02, 0.33], [0.3, 3.3], ErasingValue::Random(RandomTag::Random)));
}

#[test]
fn bad_colour_parameters_name_their_field() {
    let cases = [
        (r#"{"op": "color_jitter", "brightness": -0.1}"#, "ops[1].brightness"),
        (r#"{"op": "color_jitter", "contrast": [1.5, 0.5]}"#, "ops[1].contrast"),
        (r#"{"op": "color_jitter", "saturation": [-1, 2]}"#, "ops[1].saturation"),
        (r#"{"op": "color_jitter", "hue": 0.6}"#, "ops[1].hue"),
        (r#"{"op": "color_jitter", "hue": [-0.7, 0.1]}"#, "ops[1].hue"),
        (r#"{"op": "color_jitter", "brightness": 1e300}"#, "ops[1].brightness"),
        (r#"{"op": "random_grayscale", "p": 1.5}"#, "ops[1].p"),
        (r#"{"op": "solarize", "threshold": 256}"#, "ops[1].threshold"),
        (r#"{"op": "solarize", "threshold": 5, "p": -1}"#, "ops[1].p"),
        (r#"{"op": "posterize", "bits": 9}"#, "ops[1].bits"),
        (r#"{"op": "equalize", "p": 2}"#, "ops[1].p"),
        (r#"{"op": "autocontrast", "p": -0.5}"#, "ops[1].p"),
        (r#"{"op": "adjust_sharpness", "sharpness_factor": -1}"#, "ops[1].sharpness_factor"),
        (r#"{"op": "gaussian_blur", "kernel_size": 4}"#, "ops[1].kernel_size"),
        (r#"{"op": "gaussian_blur", "kernel_size": [3, 257]}"#, "ops[1].kernel_size"),
        (r#"{"op": "gaussian_blur", "kernel_size": 3, "sigma": 0}"#, "ops[1].sigma"),
        (r#"{"op": "gaussian_blur", "kernel_size": 3, "sigma": [2, 1]}"#, "ops[1].sigma"),
    ];
    for (op, field) in cases {
        assert_eq!(field_of(op), field, "{op}");
    }
}

#[test]
fn random_erasing_comes_last_and_its_bounds_name_the_field() {
    let erasing = |json: &str| -> Vec<OpSpec> {
        let op: OpSpec = serde_json::from_str(json).unwrap();
        let norm = OpSpec::Normalize { mean: [0.5; 3], std: [0.25; 3] };
        vec![OpSpec::Decode, OpSpec::CenterCrop { size: Size::square(8) }, norm, op]
    };
    validate_ops(&erasing(r#"{"op": "random_erasing", "value": [0, 1, 2]}"#)).unwrap();
    let mut with_layout = erasing(r#"{"op": "random_erasing"}"#);
    with_layout.insert(3, OpSpec::Layout { order: Layout::Chw });
    validate_ops(&with_layout).unwrap();
    for (json, field) in [
        (r#"{"op": "random_erasing", "p": 1.1}"#, "ops[3].p"),
        (r#"{"op": "random_erasing", "scale": [0.5, 0.1]}"#, "ops[3].scale"),
        (r#"{"op": "random_erasing", "scale": [0.1, 1.5]}"#, "ops[3].scale"),
        (r#"{"op": "random_erasing", "ratio": [0, 1]}"#, "ops[3].ratio"),
    ] {
        assert_eq!(validate_ops(&erasing(json)).unwrap_err().field, field, "{json}");
    }
    assert!(serde_json::from_str::<OpSpec>(r#"{"op": "random_erasing", "value": "noise"}"#).is_err());
    // Before a conversion, or before a crop, it is out of order.
    let e = validate_ops(&ops_with(r#"{"op": "random_erasing"}"#)).unwrap_err();
    assert_eq!(e.field, "ops[2]", "{e}");
}

#[test]
fn colour_ops_keep_the_size_and_only_drawing_ones_are_random() {
    let size = Some(Size::square(5));
    for json in [r#"{"op": "grayscale"}"#, r#"{"op": "color_jitter", "hue": 0.1}"#, r#"{"op": "random_erasing"}"#] {
        let op: OpSpec = serde_json::from_str(json).unwrap();
        assert_eq!(op.out_size(size), size, "{json}");
    }
    let random = |json: &str| serde_json::from_str::<OpSpec>(json).unwrap().is_random();
    assert!(random(r#"{"op": "color_jitter", "brightness": 0.2}"#));
    assert!(random(r#"{"op": "random_grayscale"}"#));
    assert!(random(r#"{"op": "solarize", "threshold": 9, "p": 0.5}"#));
    assert!(random(r#"{"op": "gaussian_blur", "kernel_size": 3}"#));
    assert!(random(r#"{"op": "random_erasing"}"#));
    assert!(!random(r#"{"op": "grayscale"}"#));
    assert!(!random(r#"{"op": "solarize", "threshold": 9}"#));
    assert!(!random(r#"{"op": "gaussian_blur", "kernel_size": 3, "sigma": 1.5}"#));
}
