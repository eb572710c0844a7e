//! Routing: the softmax's top-k with ties to the lower index, normalized or not; rows grouped
//! by expert in row order; outputs summed in each row's order of choices; the shared expert's
//! sigmoid gate.

use super::*;

/// A mixture over `hidden = 2` whose router scores expert `e` as `x[0] * e + x[1] * bias[e]`.
fn mixture(bias: &[f32], top_k: usize, normalize: bool) -> ExpertMlp {
    let router = bias
        .iter()
        .enumerate()
        .flat_map(|(e, &b)| [e as f32, b])
        .collect();
    let dummy = || {
        let t =
            candle_core::Tensor::zeros((2, 32), candle_core::DType::F32, &candle_core::Device::Cpu)
                .unwrap();
        Linear::from_dense(t, None, Some(candle_core::DType::F32)).unwrap()
    };
    ExpertMlp {
        router,
        router_bias: None,
        experts: bias
            .iter()
            .map(|_| DenseMlp {
                gate: dummy(),
                up: dummy(),
                down: dummy(),
            })
            .collect(),
        shared: None,
        top_k,
        normalize,
        beside: None,
    }
}

#[test]
fn a_row_takes_its_most_probable_experts_most_probable_first() {
    // Scores 0, 1, 2, 3 (x = [1, 0]): experts 3 then 2.
    let moe = mixture(&[0.0; 4], 2, false);
    let routes = moe.route(&[1.0, 0.0]);
    assert_eq!(routes.experts, [3, 2]);
    let z: f32 = (0..4).map(|e| (e as f32 - 3.0).exp()).sum();
    assert!((routes.weights[0] - 1.0 / z).abs() < 1e-6);
    assert!((routes.weights[1] - (-1.0f32).exp() / z).abs() < 1e-6);
}

#[test]
fn normalized_weights_sum_to_one_and_keep_their_ratio() {
    let moe = mixture(&[0.0; 4], 2, true);
    let routes = moe.route(&[1.0, 0.0]);
    assert!((routes.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    let ratio = routes.weights[1] / routes.weights[0];
    assert!((ratio - (-1.0f32).exp()).abs() < 1e-6);
}

#[test]
fn equal_scores_go_to_the_lower_index() {
    // x = [0, 1]: scores are the biases; experts 1 and 3 tie above the rest.
    let moe = mixture(&[0.0, 2.0, 1.0, 2.0], 2, true);
    assert_eq!(moe.route(&[0.0, 1.0]).experts, [1, 3]);
    let moe = mixture(&[0.0, 2.0, 1.0, 2.0], 1, true);
    let routes = moe.route(&[0.0, 1.0]);
    assert_eq!(
        (routes.experts.as_slice(), routes.weights[0]),
        (&[1][..], 1.0)
    );
}

#[test]
fn each_row_routes_on_its_own_values() {
    let moe = mixture(&[5.0, 0.0, 0.0, 0.0], 1, true);
    let alone: Vec<Routes> = [[1.0, 0.0], [0.0, 1.0]]
        .iter()
        .map(|x| moe.route(x))
        .collect();
    let together = moe.route(&[1.0, 0.0, 0.0, 1.0]);
    assert_eq!(together.experts, [alone[0].experts[0], alone[1].experts[0]]);
    assert_eq!(together.experts, [3, 0]);
    assert_eq!(
        together.by_expert(4),
        vec![vec![(1, 0)], vec![], vec![], vec![(0, 0)]]
    );
}

#[test]
fn outputs_are_summed_in_each_rows_order_of_choices() {
    let routes = Routes {
        top_k: 2,
        experts: vec![3, 1, 0, 2],
        weights: vec![0.75, 0.25, 0.5, 0.5],
    };
    // Row 0's two choices, then row 1's: [rows][top_k][hidden = 2].
    let chosen = [4.0, 8.0, 1.0, 2.0, 2.0, 0.0, 0.0, 6.0];
    let mut out = Vec::new();
    combine(&routes, &chosen, 2, &mut out);
    assert_eq!(out, [3.25, 6.5, 1.0, 3.0]);
    assert_eq!(
        routes.by_expert(4),
        vec![vec![(1, 0)], vec![(0, 1)], vec![(1, 1)], vec![(0, 0)]]
    );
}

#[test]
fn the_shared_expert_is_scaled_by_the_sigmoid_of_its_gate() {
    let mut out = vec![1.0, 1.0];
    add_shared(&[2.0, -1.0], &[4.0, -2.0], Some(&[0.5, 1.0]), &mut out);
    // gate . h = 0: the sigmoid is one half.
    assert_eq!(out, [3.0, 0.0]);
    // Without a gate (Granite 4.0-H) the output is added as it is.
    let mut out = vec![1.0, 1.0];
    add_shared(&[2.0, -1.0], &[4.0, -2.0], None, &mut out);
    assert_eq!(out, [5.0, -1.0]);
    assert!((sigmoid(3.0) - 1.0 / (1.0 + (-3.0f32).exp())).abs() < 1e-7);
}

#[test]
fn dot_sums_every_element() {
    let a: Vec<f32> = (0..19).map(|i| i as f32).collect();
    let b = vec![1.0; 19];
    assert_eq!(dot(&a, &b), (0..19).sum::<i32>() as f32);
}
