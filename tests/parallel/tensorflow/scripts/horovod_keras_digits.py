"""A Keras model.fit script written for Horovod, in the style of Horovod's
tensorflow2_keras_mnist.py example (Keras 2 idioms such as `experimental_run_tf_function`,
so it runs with TF_USE_LEGACY_KERAS=1).

Its only hvdtrain-specific line is the import: `import horovod.tensorflow.keras as hvd`
became `import hvdtrain.tensorflow.keras as hvd`. It trains a small CNN on scikit-learn's digits.
"""

import sys

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvdtrain.tensorflow.keras as hvd

checkpoint_dir = sys.argv[1]

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process)
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

digits = load_digits()
images = (digits.images[..., np.newaxis] / 16.0).astype(np.float32)
x_train, x_test, y_train, y_test = train_test_split(images, digits.target, test_size=0.25, random_state=0)

dataset = tf.data.Dataset.from_tensor_slices((tf.cast(x_train, tf.float32), tf.cast(y_train, tf.int64)))
dataset = dataset.repeat().shuffle(1000, seed=hvd.rank()).batch(32)

tf.keras.utils.set_random_seed(1 + hvd.rank())  # different initial weights on purpose: rank 0's win
digits_model = tf.keras.Sequential([
    tf.keras.layers.Conv2D(16, [3, 3], activation="relu", padding="same", input_shape=(8, 8, 1)),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Conv2D(32, [3, 3], activation="relu", padding="same"),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(64, activation="relu"),
    tf.keras.layers.Dense(10, activation="softmax"),
])

# Horovod: adjust learning rate based on number of GPUs.
scaled_lr = 0.001 * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1, average_aggregated_gradients=True)

# Horovod: Specify `experimental_run_tf_function=False` to ensure TensorFlow
# uses hvd.DistributedOptimizer() to compute gradients.
digits_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"],
                     experimental_run_tf_function=False)

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    # This is necessary to ensure consistent initialization of all workers when
    # training is started with random weights or restored from a checkpoint.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),

    # Horovod: average metrics among workers at the end of every epoch.
    #
    # Note: This callback must be in the list before the ReduceLROnPlateau,
    # TensorBoard or other metrics-based callbacks.
    hvd.callbacks.MetricAverageCallback(),

    # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final
    # accuracy. Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during
    # the first three epochs. See https://arxiv.org/abs/1706.02677 for details.
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3, verbose=1),
]

# Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
if hvd.rank() == 0:
    callbacks.append(tf.keras.callbacks.ModelCheckpoint(checkpoint_dir + "/checkpoint-{epoch}.h5"))

# Horovod: write logs on worker 0.
verbose = 1 if hvd.rank() == 0 else 0

# Train the model.
# Horovod: adjust number of steps based on number of GPUs.
history = digits_model.fit(dataset, steps_per_epoch=160 // hvd.size(), callbacks=callbacks, epochs=4,
                           verbose=verbose)

loss, accuracy = digits_model.evaluate(x_test, y_test, verbose=0)
accuracy = hvd.allreduce(accuracy, name="test_accuracy")
weights = np.concatenate([w.reshape(-1) for w in digits_model.get_weights()])
every_rank = hvd.allgather(weights[np.newaxis])
if hvd.rank() == 0:
    print("Accuracy: %.2f%%" % (100.0 * float(accuracy)), flush=True)
    print("weights identical on all ranks:", bool(np.all(every_rank.numpy() == weights)), flush=True)
