//! The shipped recipes, the run configuration's fields and its errors.

use super::*;

#[test]
fn shipped_configs_parse_and_validate() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
    let nanogpt = TrainConfig::load(&dir.join("nanogpt_cpu.toml")).unwrap();
    assert_eq!(
        nanogpt,
        TrainConfig::default(),
        "nanogpt_cpu.toml is the built-in default"
    );
    let tiny = TrainConfig::load(&dir.join("tiny_cpu.toml")).unwrap();
    assert_eq!(
        tiny,
        TrainConfig::default_run(),
        "the built-in copy is the file"
    );
    assert_eq!(
        (tiny.n_layer, tiny.n_head, tiny.n_embd, tiny.block_size),
        (4, 4, 128, 64),
        "the default run trains nanoGPT's tiny model"
    );
    assert_eq!(
        (tiny.position, tiny.norm, tiny.optimizer),
        (Position::Rope, Norm::Rmsnorm, OptimizerKind::Muon)
    );
    let gpu = TrainConfig::load(&dir.join("shakespeare_char.toml")).unwrap();
    assert_eq!((gpu.n_layer, gpu.n_head, gpu.n_embd), (6, 6, 384));
    assert_eq!(
        (gpu.block_size, gpu.batch_size, gpu.max_iters),
        (256, 64, 5000)
    );
    assert_eq!(gpu.dropout, 0.2);
    assert_eq!(
        (gpu.position, gpu.optimizer),
        (Position::Learned, OptimizerKind::Adamw),
        "shakespeare_char.toml stays nanoGPT's GPU recipe"
    );
    let muon = TrainConfig::load(&dir.join("muon_cpu.toml")).unwrap();
    assert_eq!(
        muon,
        TrainConfig {
            max_iters: 880,
            lr_decay_iters: 880,
            muon_beta2: 0.0,
            eval_interval: 440,
            checkpoint_interval: 220,
            ..tiny.clone()
        },
        "muon_cpu.toml is the default run before NorMuon"
    );
    let bpe = TrainConfig::load(&dir.join("shakespeare_bpe.toml")).unwrap();
    assert_eq!(
        bpe,
        TrainConfig {
            tokenizer: "bpe".into(),
            vocab_size: 2048,
            ..muon.clone()
        },
        "shakespeare_bpe.toml is muon_cpu with a BPE"
    );
    let long = TrainConfig::load(&dir.join("shakespeare_10min.toml")).unwrap();
    assert_eq!(
        (long.position, long.optimizer),
        (tiny.position, tiny.optimizer)
    );
    for c in [&nanogpt, &tiny, &muon, &gpu, &bpe, &long] {
        c.validate().unwrap();
    }
    let finetune = TrainConfig::load(&dir.join("finetune_shakespeare.toml")).unwrap();
    assert_eq!(finetune.init_from.as_deref(), Some(Path::new("gpt2")));
    assert_eq!((finetune.block_size, finetune.batch_size), (256, 4));
    assert_eq!(finetune.optimizer, OptimizerKind::Adamw);
    finetune.validate().unwrap();
}

/// A recipe names every model option and the optimizer and schedule, so that it keeps its
/// meaning whatever the built-in defaults become (fine-tuning takes the model's from its
/// checkpoint).
#[test]
fn every_shipped_recipe_names_the_model_options_and_the_optimizer() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
    let named = MODEL_FIELDS.iter().chain(&["optimizer", "lr_schedule"]);
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap() == "finetune_shakespeare.toml" {
            continue;
        }
        let table: toml::Table = toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for field in named.clone() {
            assert!(
                table.contains_key(*field),
                "{} does not name {field}",
                path.display()
            );
        }
    }
}

#[test]
fn the_model_config_is_the_run_configs_fields() {
    let c = TrainConfig {
        n_layer: 3,
        n_head: 2,
        n_embd: 24,
        block_size: 16,
        dropout: 0.1,
        bias: false,
        activation: Activation::GeluTanh,
        layer_norm_epsilon: 1e-6,
        ..TrainConfig::default()
    };
    let expected = GptConfig::new(7, 16)
        .with_n_layer(3)
        .with_n_head(2)
        .with_n_embd(24)
        .with_dropout(0.1)
        .with_bias(false)
        .with_activation(Activation::GeluTanh)
        .with_layer_norm_epsilon(1e-6);
    assert_eq!(c.model(7), expected);
    // The architecture is every field of the model but dropout, and the tokenizer.
    let fields = architecture();
    for field in MODEL_FIELDS {
        assert_eq!(
            fields.contains(&field.to_string()),
            *field != "dropout",
            "{field}"
        );
    }
    assert_eq!(fields.len(), MODEL_FIELDS.len() + 1);
    assert!(
        fields.contains(&"tokenizer".to_string()) && fields.contains(&"vocab_size".to_string())
    );
}

#[test]
fn architecture_comes_from_the_other_config_and_nothing_else() {
    let mine = TrainConfig {
        learning_rate: 3e-4,
        dropout: 0.1,
        init_from: Some("ckpt".into()),
        ..TrainConfig::default()
    };
    let theirs = TrainConfig {
        n_layer: 6,
        n_head: 6,
        n_embd: 384,
        block_size: 256,
        bias: false,
        learning_rate: 1.0,
        ..TrainConfig::default()
    };
    let c = mine.with_architecture_of(&theirs);
    assert_eq!(
        (c.n_layer, c.n_head, c.n_embd, c.block_size, c.bias),
        (6, 6, 384, 256, false)
    );
    assert_eq!((c.learning_rate, c.dropout), (3e-4, 0.1));
    assert_eq!(c.init_from, mine.init_from);
}

#[test]
fn unknown_key_and_wrong_type_name_line_and_key() {
    let err = TrainConfig::parse("n_layer = 2\nn_layers = 3\n").unwrap_err();
    assert!(err.contains("line 2") && err.contains("n_layers"), "{err}");
    let err = TrainConfig::parse("batch_size = \"big\"\n").unwrap_err();
    assert!(
        err.contains("line 1") && err.contains("batch_size"),
        "{err}"
    );
    let err = TrainConfig::parse("n_layer = \n").unwrap_err();
    assert!(err.contains("line 1"), "{err}");
}

#[test]
fn out_of_range_values_name_the_field() {
    type Breakage = fn(&mut TrainConfig);
    let cases: [(Breakage, &str); 6] = [
        (|c| c.batch_size = 0, "batch_size"),
        (|c| c.learning_rate = -1.0, "learning_rate"),
        (|c| c.n_head = 3, "n_embd"),
        (|c| c.dropout = 1.0, "dropout"),
        (|c| c.block_size = 0, "block_size"),
        (|c| c.beta2 = 1.0, "beta2"),
    ];
    for (break_it, field) in cases {
        let mut c = TrainConfig::default();
        break_it(&mut c);
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains(&format!("`{field}`")), "{field}: {err}");
    }
}
