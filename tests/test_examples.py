"""The two programs ported in examples/ (TensorFlow's custom-training tutorial
and Keras's imbalanced-classification example) train on 2 replicas as their
plain originals do on one device: the same weights and the same metrics."""

import os
import sys

import numpy as np
import pytest
import tensorflow as tf

import trainer
from conftest import REPO
from presets import train

sys.path.insert(0, os.path.join(REPO, "examples"))
import imbalanced_task  # noqa: E402 (examples/ is not a package)
import keras_imbalanced  # noqa: E402
import tf_distributed_tutorial  # noqa: E402
import tutorial_task  # noqa: E402


def _assert_same_weights(model_dir, original, atol):
  _, ours = trainer.load(model_dir)
  assert len(ours.weights) == len(original.weights)
  for a, b in zip(ours.weights, original.weights):
    np.testing.assert_allclose(a.numpy(), b.numpy(), atol=atol, err_msg=a.path)


def test_the_imbalanced_port_trains_as_keras_fit_with_class_weights(model_dir):
  # 30 epochs of 5 unshuffled batches of 64, without dropout (its masks are
  # random): Keras' fit on one device against the task on two replicas.
  results = train("--global_batch_size=64", "--shuffle=false",
                  task=imbalanced_task.Fraud(dropout=0.0), model_dir=model_dir,
                  cpu_devices=2, train_steps=150, mode="train_and_eval")
  original, history = keras_imbalanced.train(epochs=30, dropout=0.0, shuffle=False,
                                             verbose=0)
  _assert_same_weights(model_dir, original, atol=1e-5)
  for name in ("loss", "auc", "precision", "recall", "fn", "fp", "tn", "tp"):
    theirs = history.history[f"val_{name}"][-1]
    assert results["eval"][name] == pytest.approx(theirs, rel=1e-5, abs=1e-6), name
  assert results["eval"]["examples"] == 77


def test_the_tutorial_port_trains_as_the_tutorials_loop(model_dir):
  # Two epochs: Adam amplifies the last bit of a sum's order (one device against
  # two replicas) past 1e-5 in a few more.
  results = train("--global_batch_size=64", "--shuffle=false",
                  task=tutorial_task.Tutorial(), model_dir=model_dir, cpu_devices=2,
                  train_steps=40, mode="train_and_eval")
  original, measured = tf_distributed_tutorial.train(
      epochs=2, shuffle=False, strategy=tf.distribute.OneDeviceStrategy("/cpu:0"),
      verbose=False)
  _assert_same_weights(model_dir, original, atol=1e-5)
  assert results["eval"]["loss"] == pytest.approx(measured["test_loss"], rel=1e-5)
  assert results["eval"]["accuracy"] == pytest.approx(measured["test_accuracy"],
                                                      abs=1e-6)
  assert results["eval"]["examples"] == 517
