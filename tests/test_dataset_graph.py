"""What a dataset's graph says of it (trainer/data/dataset_graph.py): whether its
elements are batches, wherever the batch() sits (inside flat_map, interleave,
sample_from_datasets, group_by_window), and what a second read changes, op by
op (zip, enumerate, scan after a shuffle; nondeterministic maps)."""

import pytest
import tensorflow as tf

from trainer.data import dataset_graph
from trainer.data.dataset_graph import ELEMENTS, ORDER

from conftest import TESTS, one_line_error, read_results, run_cli, assert_bit_identical

_EXAMPLES = tf.data.Dataset.range(100).map(lambda x: (tf.cast(x, tf.float32), x))
_BATCHED = _EXAMPLES.batch(32)
_SEQUENCES = tf.data.Dataset.range(100).map(lambda x: tf.fill([x % 5 + 1], x))

BATCHING = {  # name: (dataset, depth, kind)
    "examples": (_EXAMPLES, 0, None),
    "batched": (_BATCHED, 1, "batch"),
    "unbatched again": (_BATCHED.unbatch(), 0, None),
    "mapped after batch": (_BATCHED.map(lambda x, y: (2 * x, y)), 1, "batch"),
    "sample_from_datasets of batches": (
        tf.data.Dataset.sample_from_datasets([_BATCHED, _BATCHED], seed=1), 1,
        "batch"),
    "batched inside flat_map": (
        tf.data.Dataset.range(3).flat_map(lambda i: _EXAMPLES.batch(8)), 1, "batch"),
    "batched inside interleave": (
        tf.data.Dataset.range(3).interleave(lambda i: _EXAMPLES.batch(8),
                                            num_parallel_calls=2), 1, "batch"),
    "examples inside flat_map": (
        tf.data.Dataset.range(3).flat_map(lambda i: _EXAMPLES), 0, None),
    "batches of batches": (_BATCHED.batch(2), 2, "batch"),
    "padded": (_SEQUENCES.padded_batch(4), 1, "padded"),
    "bucket_by_sequence_length": (_SEQUENCES.bucket_by_sequence_length(
        lambda x: tf.shape(x)[0], [3], [4, 4]), 1, "padded"),
    "ragged_batch": (_SEQUENCES.ragged_batch(4), 1, "ragged"),
    "from_tensors": (tf.data.Dataset.from_tensors(tf.zeros([10, 3])), 0, None),
    # A function's argument is an element of its op's input: its batching.
    "batches wrapped by flat_map": (
        _BATCHED.flat_map(lambda x, y: tf.data.Dataset.from_tensors((x, y))), 1,
        "batch"),
    "batches sliced by flat_map": (
        _BATCHED.flat_map(lambda x, y: tf.data.Dataset.from_tensor_slices((x, y))),
        0, None),
    "windows of batches zipped": (
        _BATCHED.window(2).flat_map(lambda x, y: tf.data.Dataset.zip((x, y))), 1,
        "batch"),
    "a batched dataset inside from_tensors": (
        tf.data.Dataset.from_tensors(_BATCHED).flat_map(lambda d: d), 1, "batch"),
    "batches enumerated": (_BATCHED.enumerate(), 1, "batch"),
}


def test_a_source_the_graph_cannot_see_into_is_said_to_be_opaque():
  """A generator's or from_tensors' elements are whatever Python gives: depth 0
  is what the graph sees, and it says so (trainer.fit takes them as Keras's
  batches)."""
  generated = tf.data.Dataset.from_generator(
      lambda: iter([1, 2]), output_signature=tf.TensorSpec([], tf.int32))
  assert dataset_graph.batching(generated).opaque
  assert dataset_graph.batching(tf.data.Dataset.from_tensors(tf.zeros([3]))).opaque
  assert not dataset_graph.batching(_EXAMPLES).opaque


@pytest.mark.parametrize("name", BATCHING)
def test_batching_is_read_from_the_graph(name):
  dataset, depth, kind = BATCHING[name]
  found = dataset_graph.batching(dataset)
  assert (found.depth, found.kind) == (depth, kind), found


@pytest.mark.parametrize("dataset, why", [
    (tf.data.Dataset.sample_from_datasets([_BATCHED, _EXAMPLES], seed=1),
     "it mixes batches and single examples"),
    (_EXAMPLES.window(4), "it yields datasets (window())")])
def test_what_the_graph_cannot_tell_is_said(dataset, why):
  found = dataset_graph.batching(dataset)
  assert found.depth is None and found.why.startswith(why), found


VARIATION = {  # name: (dataset, what a second read changes)
    "plain": (_EXAMPLES, None),
    "cached and repeated": (_EXAMPLES.cache().repeat(2).prefetch(2), None),
    "unseeded shuffle": (_EXAMPLES.shuffle(10), ORDER),
    "seeded shuffle, then a map": (
        _EXAMPLES.shuffle(10, seed=1).map(lambda x, y: (x + 1, y)), ORDER),
    "nondeterministic parallel map": (
        _EXAMPLES.map(lambda x, y: (x, y), num_parallel_calls=2,
                      deterministic=False), ORDER),
    "zip after a shuffle": (
        tf.data.Dataset.zip((_EXAMPLES.shuffle(10), tf.data.Dataset.range(100))),
        ELEMENTS),
    "enumerate after a shuffle": (_EXAMPLES.shuffle(10).enumerate(), ELEMENTS),
    "scan after a shuffle": (
        _EXAMPLES.shuffle(10).scan(0.0, lambda s, e: (s + e[0], (s, e[1]))),
        ELEMENTS),
    "batch after a shuffle": (_EXAMPLES.shuffle(10).batch(4), ELEMENTS),
    "take after a nondeterministic map": (
        _EXAMPLES.map(lambda x, y: (x, y), num_parallel_calls=2,
                      deterministic=False).take(10), ELEMENTS),
    "a random map": (_EXAMPLES.map(lambda x, y: (x + tf.random.uniform([]), y)),
                     ELEMENTS),
    "batched and unbatched again after a shuffle": (
        _EXAMPLES.shuffle(10).batch(4).prefetch(2).unbatch(), ORDER),
    "a remainder dropped after a shuffle": (
        _EXAMPLES.shuffle(10).batch(4, drop_remainder=True).unbatch(), ELEMENTS),
    "a generator": (tf.data.Dataset.from_generator(
        lambda: iter([1, 2]), output_signature=tf.TensorSpec([], tf.int32)),
                    ELEMENTS),
}


@pytest.mark.parametrize("name", VARIATION)
def test_what_a_second_read_changes(name):
  dataset, expected = VARIATION[name]
  assert dataset_graph.read_variation(dataset) == expected


def test_batches_inside_a_flat_map_are_unbatched_and_train_as_examples(tmp_path):
  """Batches of 32 made inside a flat_map: each step trained on 8 batches of
  32 (256 examples) while results.json counted 8. Now they are unbatched, one
  line says so, and the run equals one on the same examples unbatched."""
  flags = ["--train_steps=10", "--per_replica_batch_size=8", "--deterministic",
           "--mode=train"]
  batched = run_cli("--task=user_tasks:BatchedInFlatMap", *flags,
                    f"--model_dir={tmp_path / 'batched'}", python_path=TESTS)
  assert batched.returncode == 0, batched.stderr[-2000:]
  assert ("Task.train_data(): the dataset yields batches; the framework unbatches "
          "them") in batched.stdout
  plain = run_cli("--task=user_tasks:BatchedInFlatMap", "--task.batched=false",
                  *flags, f"--model_dir={tmp_path / 'plain'}", python_path=TESTS)
  assert plain.returncode == 0, plain.stderr[-2000:]
  assert_bit_identical(tmp_path / "batched", tmp_path / "plain")
  assert read_results(tmp_path / "batched")["replica_examples"] == {"replica_0": 80}


@pytest.mark.parametrize("task, fragment", [
    ("BatchedInFlatMap --task.mixed=true", "Task.train_data(): cannot tell whether "
     "the dataset's elements are examples or batches: it mixes batches and single "
     "examples"),
    ("BucketedSequences", "Task.train_data(): the dataset yields padded batches, "
     "whose shapes differ from batch to batch"),
    ("RaggedBatches", "Task.train_data(): the dataset yields ragged batches, "
     "whose shapes differ from batch to batch")])
def test_batches_that_cannot_be_examples_are_refused_in_one_line(tmp_path, task,
                                                                 fragment):
  """bucket_by_sequence_length's padded batches hid inside group_by_window: a
  50-line traceback, and a process that never ended; ragged_batch trained."""
  name, *extra = task.split()
  model_dir = tmp_path / "run"
  process = run_cli(f"--task=user_tasks:{name}", *extra, "--train_steps=5",
                    f"--model_dir={model_dir}", python_path=TESTS)
  one_line_error(process, fragment)
  assert not model_dir.exists()


def test_reading_a_vocabulary_or_a_variable_is_no_variation():
  """A TextVectorization's lookup table and a Normalization's variables read
  the same values every time; assigning a variable in the pipeline does not."""
  import keras
  vectorize = keras.layers.TextVectorization(max_tokens=10)
  vectorize.adapt(["a b c", "b c d"])
  counter = tf.Variable(0)
  texts = tf.data.Dataset.from_tensor_slices(["a b", "c d"])
  assert dataset_graph.read_variation(texts.map(vectorize)) is None
  assert dataset_graph.read_variation(
      texts.map(lambda t: (t, counter.assign_add(1)))) == ELEMENTS


@pytest.mark.parametrize("array_input", ["gather", "dataset"])
def test_elements_that_change_shape_between_batches_are_one_line(tmp_path,
                                                                 array_input):
  """Elements of 3 features, then 4, in whole batches of 8: the model received
  a batch of the new shape and the run exited 1 with a traceback blaming it.
  Held in memory, the change is found before anything is written; streamed, at
  the batch."""
  model_dir = tmp_path / "run"
  process = run_cli("--task=user_tasks:ShapesChangeMidRun", "--train_steps=100",
                    "--shuffle=false", "--per_replica_batch_size=8",
                    f"--array_input={array_input}", f"--model_dir={model_dir}",
                    python_path=TESTS)
  one_line_error(process, "Task.train_data(): its elements change shape: the "
                 "first has [3], a later one [4]")
  assert model_dir.exists() == (array_input == "dataset")
