"""The dataset's classes: sharding with --classes found/file, the manifest's class list, and the trainer's head
and label check following it."""

import json

import pytest
import tensorflow as tf

from beam_preprocess import __main__ as cli
from beam_preprocess import classes, sample_data
from beam_preprocess.config import ShardingConfig
from effnet_common import schema
from effnet_common.manifest import LabelConvention, Manifest, ManifestError
from trainer_module import presets, resolve
from trainer_module.data import input_pipeline

DIGIT_SYNSETS = sample_data.default_synsets(10)


def _labels_and_synsets(pattern):
    pairs = []
    for path in tf.io.gfile.glob(pattern):
        for record in tf.data.TFRecordDataset(path):
            feature = tf.train.Example.FromString(record.numpy()).features.feature
            pairs.append(
                (
                    feature[schema.LABEL].int64_list.value[0],
                    feature[schema.SYNSET].bytes_list.value[0].decode(),
                )
            )
    return pairs


def _shard(archives, out, *extra):
    args = ["--train-archive", archives.train_archive, "--val-archive", archives.val_archive]
    args += ["--output-dir", out, "--train-shards", 2, "--val-shards", 2, *extra]
    assert cli.main([str(a) for a in args]) == 0
    with open(out / "manifest.json") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def found_run(clean_archives, tmp_path_factory):
    out = tmp_path_factory.mktemp("found")
    return out, _shard(clean_archives, out, "--classes", "found")


def test_found_classes_number_the_training_synsets_in_sorted_order(found_run):
    out, manifest = found_run
    assert manifest["num_classes"] == 10
    assert manifest["synsets"] == sorted(DIGIT_SYNSETS)
    assert "0..9" in manifest["label_convention"]
    position = {wnid: i for i, wnid in enumerate(manifest["synsets"])}
    for split in (schema.TRAIN, schema.VALIDATION):
        pairs = _labels_and_synsets(str(out / split / "*"))
        assert len(pairs) == manifest["splits"][split]["records"] > 0
        assert all(label == position[synset] for label, synset in pairs)
        assert {label for label, _ in pairs} == set(range(10))


def test_imagenet_classes_are_the_default_and_the_manifest_lists_no_synsets(clean_archives, tmp_path):
    manifest = _shard(clean_archives, tmp_path)
    assert manifest["num_classes"] == 1000 and "synsets" not in manifest
    ranks = schema.synset_to_label()
    pairs = _labels_and_synsets(str(tmp_path / schema.TRAIN / "*"))
    assert pairs and all(label == ranks[synset] for label, synset in pairs)


def test_a_class_file_sets_the_order_and_images_of_other_synsets_are_failures(clean_archives, tmp_path):
    listed = list(reversed(DIGIT_SYNSETS[1:]))  # nine classes, in an order of the file's own
    class_file = tmp_path / "classes.txt"
    class_file.write_text("# the digits but zero\n\n" + "\n".join(listed) + "\n")
    out = tmp_path / "out"
    manifest = _shard(clean_archives, out, "--classes-file", class_file, "--max-failures", 1000)
    assert manifest["synsets"] == listed and manifest["num_classes"] == 9
    left_out = [f for f in manifest["failures"] if DIGIT_SYNSETS[0] in f["reason"]]
    images_of_zero = sum(1 for s in clean_archives.train.values() if s == DIGIT_SYNSETS[0])
    images_of_zero += sum(1 for s in clean_archives.validation.values() if s == DIGIT_SYNSETS[0])
    assert len(left_out) == images_of_zero > 0
    assert "not one of the 9 classes (the class file" in left_out[0]["reason"]
    pairs = _labels_and_synsets(str(out / schema.TRAIN / "*"))
    assert pairs and all(label == listed.index(synset) for label, synset in pairs)


def test_images_outside_the_classes_count_against_the_failure_budget(clean_archives, tmp_path):
    class_file = tmp_path / "classes.txt"
    class_file.write_text("\n".join(DIGIT_SYNSETS[:5]))
    args = ["--train-archive", clean_archives.train_archive, "--val-archive", clean_archives.val_archive]
    args += ["--output-dir", tmp_path / "out", "--classes-file", class_file]
    assert cli.main([str(a) for a in args]) != 0
    with open(tmp_path / "out" / "manifest.failed.json") as f:
        reasons = [failure["reason"] for failure in json.load(f)["failures"]]
    assert reasons and all("is not one of the 5 classes" in reason for reason in reasons)


@pytest.mark.parametrize(
    "text,message",
    [
        ("n01440764\nnot_a_wnid\n", "line 2: 'not_a_wnid' is not an ILSVRC2012 synset"),
        ("n01440764\n# c\nn01443537\nn01440764\n", "line 4: n01440764 is listed twice (first on line 1)"),
        ("# only one\nn01440764\n", "lists 1 synset(s)"),
    ],
)
def test_a_bad_class_file_is_refused_naming_the_line(text, message, tmp_path, capsys):
    class_file = tmp_path / "classes.txt"
    class_file.write_text(text)
    code = cli.main(
        ["--train-dir", str(tmp_path), "--output-dir", str(tmp_path / "o"), "--classes-file", str(class_file)]
    )
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--classes-file" in err[0] and message in err[0]


def test_config_refuses_classes_that_cannot_be_built(tmp_path):
    with pytest.raises(ValueError, match="classes='found' takes the classes from the training input"):
        ShardingConfig(output_dir=str(tmp_path), val_archive="val.tar", classes=classes.FOUND)
    with pytest.raises(ValueError, match="classes='file' goes with classes_file"):
        ShardingConfig(output_dir=str(tmp_path), train_archive="t.tar", classes=classes.FILE)
    with pytest.raises(ValueError, match="classes"):
        ShardingConfig(output_dir=str(tmp_path), train_archive="t.tar", classes="coco")


def test_manifest_keeps_the_class_list_and_refuses_an_inconsistent_one():
    convention = classes.found_classes("", ["n02", "n01", "n02"]).label_convention()
    assert convention.synsets == ("n01", "n02") and convention.num_classes == 2
    manifest = Manifest(splits={}, label_convention=convention, feature_keys=(), options={}, failures=())
    again = Manifest.from_json(manifest.to_json())
    assert again.label_convention == convention and again.label_convention.class_synsets() == ("n01", "n02")
    assert len(LabelConvention("imagenet").class_synsets()) == 1000
    with pytest.raises(ManifestError, match="num_classes 3 but 2 synsets"):
        LabelConvention("x", num_classes=3, synsets=("a", "b"))
    with pytest.raises(ManifestError, match="without the synsets list"):
        LabelConvention("x", num_classes=10)


# ---------------------------------------------------------------------------------------------- trainer


def test_trainer_sizes_its_head_from_the_manifest(found_run):
    out, _ = found_run
    train, evaluation = str(out / schema.TRAIN / "*"), str(out / schema.VALIDATION / "*")
    config = resolve.resolve_run(
        presets.get_preset("demo"), data=resolve.data_sizes(train, evaluation)
    ).config
    assert config.model.num_classes == 10
    assert config.data.num_train_examples == len(_labels_and_synsets(train))
    assert input_pipeline.shard_classes(train) == tuple(sorted(DIGIT_SYNSETS))


def _eval_labels(pattern, synsets, num_classes):
    dataset = input_pipeline.build_eval_dataset(
        pattern, None, input_pipeline.EvalInputs(64, 32, num_classes=num_classes, synsets=synsets)
    )
    return [int(x) for batch in dataset for x, m in zip(batch["labels"], batch["mask"], strict=True) if m > 0]


def test_label_check_follows_the_manifest_classes(found_run):
    out, manifest = found_run
    pattern = str(out / schema.VALIDATION / "*")
    labels = _eval_labels(pattern, manifest["synsets"], 10)
    assert sorted(set(labels)) == list(range(10))
    # Read as ImageNet's numbering, the first record's synset sits elsewhere: one LabelError line naming it.
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        _eval_labels(pattern, None, 1000)
    with pytest.raises(input_pipeline.LabelError, match="synset n0.* is class [0-9]+, but its stored label"):
        input_pipeline.raise_label_error(caught.value, 0, 1000)


def test_shards_of_two_numberings_are_not_read_together(found_run, clean_archives, tmp_path):
    out, _ = found_run
    _shard(clean_archives, tmp_path)
    with pytest.raises(ValueError, match="must share one label numbering"):
        input_pipeline.shard_classes([str(out / schema.TRAIN / "*"), str(tmp_path / schema.TRAIN / "*")])
