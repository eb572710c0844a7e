//! The KV store's unit tests: layouts, f16 rounding, writes and moves, windowed spaces.
use super::*;

#[test]
fn prefault_keeps_what_the_pool_holds() {
    for dtype in [KvDtype::F16, KvDtype::F32] {
        // Keys and values of many pages each.
        let (slots, width) = (4096, 8);
        let mut store = PagedKvStore::new(2, slots, (2, width / 2), dtype);
        let rows: Vec<Slot> = (0..slots as u32).step_by(7).map(Slot).collect();
        let k: Vec<f32> = (0..rows.len() * width).map(|i| (i % 97) as f32).collect();
        let v: Vec<f32> = k.iter().map(|x| -x - 1.0).collect();
        store.write(1, &rows, &k, &v).unwrap();
        let before = store.layer(1).to_f32();
        assert!(before.1.iter().any(|&x| x != 0.0));
        store.prefault();
        assert_eq!(store.layer(1).to_f32(), before, "{dtype:?}");
        assert!(store.layer(0).to_f32().0.iter().all(|&x| x == 0.0));
    }
}

#[test]
fn write_then_move_keeps_rows_intact() {
    for dtype in [KvDtype::F16, KvDtype::F32] {
        let mut store = PagedKvStore::new(2, 8, (1, 3), dtype);
        store
            .write(
                1,
                &[Slot(5), Slot(2)],
                &[1., 2., 3., 4., 5., 6.],
                &[7., 8., 9., 10., 11., 12.],
            )
            .unwrap();
        let (k, v) = store.layer(1).to_f32();
        assert_eq!(&k[15..18], &[1., 2., 3.]);
        assert_eq!(&v[6..9], &[10., 11., 12.]);
        store
            .apply_moves(&[KvMove::full(Slot(5), Slot(0))])
            .unwrap();
        let (k, _) = store.layer(1).to_f32();
        assert_eq!(&k[0..3], &[1., 2., 3.]);
        assert!(store.write(0, &[Slot(8)], &[0.; 3], &[0.; 3]).is_err());
        // Keys padded to one tile of 16 slots, values 8.
        assert_eq!(store.bytes(), 2 * (16 + 8) * 3 * dtype.size());
    }
}

#[test]
fn each_kv_head_keeps_its_own_rows() {
    // Two heads of two values: a written row lands as one run per head, and a move
    // carries every head.
    let mut store = PagedKvStore::new(1, 4, (2, 2), KvDtype::F32);
    store
        .write(0, &[Slot(1)], &[1., 2., 3., 4.], &[5., 6., 7., 8.])
        .unwrap();
    store
        .apply_moves(&[KvMove::full(Slot(1), Slot(3))])
        .unwrap();
    let (k, v) = store.layer(0).to_f32();
    // [head][slot][dim]: head 0's slots are values 0..8, head 1's 8..16.
    assert_eq!((&k[2..4], &k[10..12]), (&[1., 2.][..], &[3., 4.][..]));
    assert_eq!((&k[6..8], &k[14..16]), (&[1., 2.][..], &[3., 4.][..]));
    assert_eq!((&v[6..8], &v[14..16]), (&[5., 6.][..], &[7., 8.][..]));
    assert_eq!(k.iter().filter(|&&x| x != 0.0).count(), 8);
}

#[test]
fn f16_writes_round_to_nearest_and_stay_finite() {
    // Values across f16's range (subnormals, ties, the largest finite, beyond), each
    // stored the way the portable conversion stores it, whichever path this CPU takes.
    let mut values: Vec<f32> = (0..4000)
        .map(|i| {
            let x = (i as f32 * 0.37).sin() * 10f32.powi(i % 13 - 8);
            if i % 2 == 0 {
                x
            } else {
                -x
            }
        })
        .collect();
    values.extend([
        1.0 + 1.0 / 2048.0, // a tie between two f16s: rounds to even (1.0)
        65504.0,
        65519.0,
        1e9,
        -1e9,
        f32::INFINITY,
        6e-8,
        0.0,
        -0.0,
    ]);
    let n = values.len();
    let mut store = PagedKvStore::new(1, n, (1, 1), KvDtype::F16);
    let slots: Vec<Slot> = (0..n as u32).map(Slot).collect();
    store.write(0, &slots, &values, &values).unwrap();
    let (k, _) = store.layer(0).to_f32();
    for (got, x) in k.iter().zip(&values) {
        let want = f16::from_f32(x.clamp(-F16_MAX, F16_MAX)).to_f32();
        assert_eq!(got.to_bits(), want.to_bits(), "{x}");
        assert!(got.is_finite(), "{x} stored as {got}");
        assert!((got - x.clamp(-F16_MAX, F16_MAX)).abs() <= x.abs() / 2048.0 + 6e-8);
    }
    assert_eq!(k[n - 9], 1.0);
    assert_eq!(k[n - 7], 65504.0);
    let mut nan = PagedKvStore::new(1, 8, (1, 1), KvDtype::F16);
    nan.write(0, &slots[..8], &[f32::NAN; 8], &[0.0; 8])
        .unwrap();
    assert!(nan.layer(0).to_f32().0.iter().all(|x| x.is_nan()));
}

#[test]
fn windowed_layers_live_in_their_own_space() {
    let groups = [KvGroup::Full, KvGroup::Window, KvGroup::Full];
    let mut store = PagedKvStore::grouped(&groups, 64, Some(32), (1, 2), KvDtype::F32);
    assert_eq!((store.num_slots(), store.window_slots()), (64, Some(32)));
    let per_layer = |slots: usize| (slots + slots.div_ceil(KEY_TILE) * KEY_TILE) * 2 * 4;
    assert_eq!(store.bytes(), 2 * per_layer(64) + per_layer(32));
    // Slot 40 exists in the full space only.
    let (k, v) = (vec![1.0, 2.0], vec![3.0, 4.0]);
    store.write(0, &[Slot(40)], &k, &v).unwrap();
    assert!(store.write(1, &[Slot(40)], &k, &v).is_err());
    store.write(1, &[Slot(5)], &k, &v).unwrap();
    // A windowed move copies in the windowed layer only; a full move in the full ones.
    store
        .apply_moves(&[KvMove {
            from: Slot(5),
            to: Slot(6),
            group: KvGroup::Window,
        }])
        .unwrap();
    store
        .apply_moves(&[KvMove::full(Slot(40), Slot(41))])
        .unwrap();
    let value = |layer: usize, slot: usize| store.layer(layer).to_f32().1[slot * 2];
    assert_eq!((value(1, 6), value(0, 6)), (3.0, 0.0));
    assert_eq!((value(0, 41), value(2, 41)), (3.0, 0.0));
    let outside = KvMove {
        from: Slot(33),
        to: Slot(1),
        group: KvGroup::Window,
    };
    assert!(store.apply_moves(&[outside]).is_err());
    // A store without a windowed space refuses windowed moves.
    let mut plain = PagedKvStore::new(2, 16, (1, 2), KvDtype::F32);
    let inside = KvMove {
        from: Slot(1),
        ..outside
    };
    assert!(plain.apply_moves(&[inside]).is_err());
}

#[test]
fn a_layer_that_keeps_rows_writes_moves_and_counts_them() {
    let layers = [
        (KvGroup::Full, LayerStorage::Kv),
        (KvGroup::Window, LayerStorage::Rows(3)),
    ];
    let mut store = PagedKvStore::with_layers(&layers, 16, Some(8), (1, 2), KvDtype::F32);
    let kv_bytes = (16 + 16) * 2 * 4;
    assert_eq!(store.bytes(), kv_bytes + 8 * 3 * 4);
    store
        .write_rows(1, &[Slot(2), Slot(5)], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        .unwrap();
    // Rows live in the windowed space: slot 9 is outside it; K/V writes are refused.
    assert!(store.write_rows(1, &[Slot(9)], &[0.0; 3]).is_err());
    assert!(store.write_rows(1, &[Slot(1)], &[0.0; 2]).is_err());
    assert!(store.write(1, &[Slot(1)], &[0.0; 2], &[0.0; 2]).is_err());
    assert!(store.write_rows(0, &[Slot(1)], &[0.0; 3]).is_err());
    store
        .apply_moves(&[KvMove {
            from: Slot(5),
            to: Slot(6),
            group: KvGroup::Window,
        }])
        .unwrap();
    let (rows, width) = store.rows(1).unwrap();
    assert_eq!(width, 3);
    assert_eq!(&rows[6..9], &[1.0, 2.0, 3.0]);
    assert_eq!(&rows[18..21], &[4.0, 5.0, 6.0]);
    assert!(store.rows(0).is_err());
    // The attending layer still reads its keys and values; the other shows none.
    assert!(store.layer(1).to_f32().0.is_empty());
}

#[test]
fn recurrent_slots_stay_put_as_more_are_asked_for_and_copy_both_ways() {
    let mut states = states::RecurrentStates::new([0, 3].into_iter());
    assert!(states.slot(0, 0).is_err(), "layer 0 keeps no state");
    let first = states.slot(1, 1).unwrap();
    assert_eq!(first.values, &[0.0; 3]);
    first.values.copy_from_slice(&[1.0, 2.0, 3.0]);
    *first.folded = 7;
    // A far slot is made without touching slot 1, and starts at zero.
    assert_eq!(states.slot(1, 9).unwrap().values, &[0.0; 3]);
    assert_eq!(states.slot(1, 1).unwrap().values, &[1.0, 2.0, 3.0]);
    // Slots 2..8 were never asked for: they hold nothing yet.
    assert_eq!(states.bytes(), 2 * 3 * 4);
    states.copy(1, 1, 9).unwrap();
    assert_eq!(states.slot(1, 9).unwrap().values, &[1.0, 2.0, 3.0]);
    assert_eq!(*states.slot(1, 9).unwrap().folded, 7);
    states.set(1, 0, &[4.0, 5.0, 6.0], 2).unwrap();
    states.copy(1, 0, 1).unwrap();
    assert_eq!(states.slot(1, 1).unwrap().values, &[4.0, 5.0, 6.0]);
    assert_eq!(*states.slot(1, 1).unwrap().folded, 2);
    states.copy(1, 1, 1).unwrap();
    assert_eq!(states.slot(1, 1).unwrap().values, &[4.0, 5.0, 6.0]);
    assert!(states.set(1, 0, &[1.0], 0).is_err());
    assert_eq!(states.bytes_per_sequence(), 12);
    // Several at once, each once; the same slot twice is refused.
    let (main, others) = states.slots(1, 1, &[0, 9, 4]).unwrap();
    assert_eq!(main.values, &[4.0, 5.0, 6.0]);
    let got: Vec<Vec<f32>> = others.iter().map(|s| s.values.to_vec()).collect();
    assert_eq!(
        got,
        [vec![4.0, 5.0, 6.0], vec![1.0, 2.0, 3.0], vec![0.0; 3]]
    );
    assert!(states.slots(1, 1, &[1]).is_err());
    assert!(states.slots(1, 2, &[3, 3]).is_err());
}

#[test]
fn prefaulted_state_slots_are_allocated_and_keep_what_they_hold() {
    let mut states = states::RecurrentStates::new([2048, 0, 1].into_iter());
    states.set(0, 1, &[7.0; 2048], 3).unwrap();
    states.prefault(4);
    assert_eq!(
        states.bytes(),
        4 * 2048 * 4 + 4 * 4,
        "four slots of both layers"
    );
    assert_eq!(states.slot(0, 1).unwrap().values, &[7.0; 2048][..]);
    assert_eq!(*states.slot(0, 1).unwrap().folded, 3);
    assert!(states.slot(0, 3).unwrap().values.iter().all(|&v| v == 0.0));
}

#[test]
fn layers_of_their_own_heads_and_layers_that_share_read_what_was_written() {
    // Layer 0 in the store's heads (2 of 2), layer 1 in its own (1 of 4), layer 2 reading
    // layer 1's, layer 3 naming a later layer (kept as an empty layer of its own).
    let layers = [
        (KvGroup::Full, LayerStorage::Kv),
        (
            KvGroup::Full,
            LayerStorage::KvOf {
                kv_heads: 1,
                head_dim: 4,
            },
        ),
        (KvGroup::Full, LayerStorage::Shared(1)),
        (KvGroup::Full, LayerStorage::Shared(3)),
    ];
    let mut store = PagedKvStore::with_layers(&layers, 4, None, (2, 2), KvDtype::F32);
    assert_eq!(
        (0..4).map(|l| store.layer_row_width(l)).collect::<Vec<_>>(),
        [4, 4, 0, 0]
    );
    // Keys and values (4 slots, key planes padded to a tile) of two layers only.
    assert_eq!(store.bytes(), 2 * (4 + KEY_TILE) * 4 * 4);
    store
        .write(1, &[Slot(3)], &[1., 2., 3., 4.], &[5., 6., 7., 8.])
        .unwrap();
    let (k, v) = store.layer(2).to_f32();
    assert_eq!(
        (&k[12..16], &v[12..16]),
        (&[1., 2., 3., 4.][..], &[5., 6., 7., 8.][..])
    );
    assert_eq!(store.layer(1).to_f32(), (k, v));
    let err = store.write(2, &[Slot(0)], &[0.; 4], &[0.; 4]).unwrap_err();
    assert!(
        err.to_string().contains("no keys and values of its own"),
        "{err}"
    );
    assert!(store.write(3, &[Slot(0)], &[0.; 4], &[0.; 4]).is_err());
    // A move copies the shared layers' rows once, in the layer that holds them.
    store
        .apply_moves(&[KvMove::full(Slot(3), Slot(0))])
        .unwrap();
    assert_eq!(&store.layer(2).to_f32().1[0..4], &[5., 6., 7., 8.]);
}
