"""A TF1 graph trained by tf.compat.v1.train.MonitoredTrainingSession, written for Horovod in the
style of Horovod's tensorflow_mnist.py example (TF1 through tf.compat.v1, eager execution off):
hvd.DistributedOptimizer around a TF1 optimizer, hvd.BroadcastGlobalVariablesHook(0), a global
step that stops the run, and a checkpoint directory on rank 0 only.

Its only hvdtrain-specific line is the import: `import horovod.tensorflow as hvd` became
`import hvdtrain.tensorflow as hvd`. It trains a small CNN on scikit-learn's digits.
"""

import sys

import numpy as np
import tensorflow.compat.v1 as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvdtrain.tensorflow as hvd

tf.disable_v2_behavior()


def conv_model(feature, target):
    """A convolution, a pooling and two dense layers; returns predictions and the loss."""
    target = tf.one_hot(tf.cast(target, tf.int32), 10, 1.0, 0.0)
    with tf.variable_scope("conv_layer1"):
        kernel = tf.get_variable("kernel", [3, 3, 1, 16])
        h_conv1 = tf.nn.relu(tf.nn.conv2d(feature, kernel, strides=[1, 1, 1, 1], padding="SAME"))
        h_pool1 = tf.nn.max_pool(h_conv1, ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding="SAME")
    h_flat = tf.reshape(h_pool1, [-1, 4 * 4 * 16])
    with tf.variable_scope("fc1"):
        h_fc1 = tf.nn.relu(tf.matmul(h_flat, tf.get_variable("weights", [4 * 4 * 16, 64]))
                           + tf.get_variable("bias", [64], initializer=tf.zeros_initializer()))
    with tf.variable_scope("fc2"):
        logits = (tf.matmul(h_fc1, tf.get_variable("weights", [64, 10]))
                  + tf.get_variable("bias", [10], initializer=tf.zeros_initializer()))
    loss = tf.losses.softmax_cross_entropy(target, logits)
    return tf.argmax(logits, 1), loss


def train_input_generator(x_train, y_train, batch_size=32):
    while True:
        p = np.random.permutation(len(x_train))
        x_train, y_train = x_train[p], y_train[p]
        index = 0
        while index <= len(x_train) - batch_size:
            yield x_train[index:index + batch_size], y_train[index:index + batch_size]
            index += batch_size


class EvaluationHook(tf.train.SessionRunHook):
    """Runs `fetches` once training has stopped, before the session closes."""

    def __init__(self, fetches, feed_dict):
        self.fetches, self.feed_dict, self.results = fetches, feed_dict, None

    def end(self, session):
        self.results = session.run(self.fetches, feed_dict=self.feed_dict)


def main(checkpoint_root):
    # Horovod: initialize Horovod.
    hvd.init()

    digits = load_digits()
    images = (digits.images[..., np.newaxis] / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(images, digits.target, test_size=0.25, random_state=0)
    np.random.seed(hvd.rank())  # each rank its own batches
    tf.set_random_seed(1 + hvd.rank())  # and its own initial weights: rank 0's win

    with tf.name_scope("input"):
        image = tf.placeholder(tf.float32, [None, 8, 8, 1], name="image")
        label = tf.placeholder(tf.float32, [None], name="label")
    predict, loss = conv_model(image, label)

    # Horovod: adjust learning rate based on number of GPUs.
    opt = tf.train.AdamOptimizer(0.002 * hvd.size())

    # Horovod: add Horovod Distributed Optimizer.
    opt = hvd.DistributedOptimizer(opt)

    global_step = tf.train.get_or_create_global_step()
    train_op = opt.minimize(loss, global_step=global_step)

    accuracy = hvd.allreduce(tf.reduce_mean(tf.cast(tf.equal(predict, tf.cast(label, tf.int64)), tf.float32)),
                             name="accuracy")
    weights = tf.concat([tf.reshape(v, [-1]) for v in tf.trainable_variables()], axis=0)
    every_rank = hvd.allgather(tf.expand_dims(weights, 0))
    evaluation = EvaluationHook([accuracy, every_rank, weights], {image: x_test, label: y_test})

    hooks = [
        # Horovod: BroadcastGlobalVariablesHook broadcasts initial variable states
        # from rank 0 to all other processes. This is necessary to ensure consistent
        # initialization of all workers when training is started with random weights
        # or restored from a checkpoint.
        hvd.BroadcastGlobalVariablesHook(0),

        # Horovod: adjust number of steps based on number of GPUs.
        tf.train.StopAtStepHook(last_step=600 // hvd.size()),

        tf.train.LoggingTensorHook(tensors={"step": global_step, "loss": loss}, every_n_iter=100),

        evaluation,
    ]

    # Horovod: pin GPU to be used to process local rank (one GPU per process)
    config = tf.ConfigProto()
    config.gpu_options.allow_growth = True
    config.gpu_options.visible_device_list = str(hvd.local_rank())

    # Horovod: save checkpoints only on worker 0 to prevent other workers from
    # corrupting them.
    checkpoint_dir = checkpoint_root if hvd.rank() == 0 else None
    training_batch_generator = train_input_generator(x_train, y_train)

    # The MonitoredTrainingSession takes care of session initialization,
    # restoring from a checkpoint, saving to a checkpoint, and closing when done
    # or an error occurs.
    with tf.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir, hooks=hooks, config=config) as mon_sess:
        while not mon_sess.should_stop():
            # Run a training step synchronously.
            image_, label_ = next(training_batch_generator)
            mon_sess.run(train_op, feed_dict={image: image_, label: label_})

    test_accuracy, every_rank_, weights_ = evaluation.results
    if hvd.rank() == 0:
        print("Accuracy: %.2f%%" % (100.0 * test_accuracy), flush=True)
        print("weights identical on all ranks:", bool(np.all(every_rank_ == weights_)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
