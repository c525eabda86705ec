"""A TensorFlow 2 custom training loop written for Horovod, in the style of Horovod's
tensorflow2_mnist.py example (Keras 2 idioms such as `opt.variables()`, so it runs with
TF_USE_LEGACY_KERAS=1).

Its only hvdtrain-specific line is the import: `import horovod.tensorflow as hvd` became
`import hvdtrain.tensorflow as hvd`. It trains a small CNN on scikit-learn's digits.
"""

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvdtrain.tensorflow as hvd

# Initialize Horovod
hvd.init()

# Pin GPU to be used to process local rank (one GPU per process)
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

digits = load_digits()
images = (digits.images[..., np.newaxis] / 16.0).astype(np.float32)
x_train, x_test, y_train, y_test = train_test_split(images, digits.target, test_size=0.25, random_state=0)

dataset = tf.data.Dataset.from_tensor_slices((tf.cast(x_train, tf.float32), tf.cast(y_train, tf.int64)))
dataset = dataset.shard(hvd.size(), hvd.rank()).repeat().shuffle(1000, seed=hvd.rank()).batch(32)

tf.keras.utils.set_random_seed(1 + hvd.rank())  # different initial weights on purpose: rank 0's win
digits_model = tf.keras.Sequential([
    tf.keras.layers.Conv2D(16, [3, 3], activation="relu", padding="same", input_shape=(8, 8, 1)),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Conv2D(32, [3, 3], activation="relu", padding="same"),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(64, activation="relu"),
    tf.keras.layers.Dense(10, activation="softmax"),
])
loss = tf.losses.SparseCategoricalCrossentropy()

# Horovod: adjust learning rate based on number of GPUs.
opt = tf.optimizers.Adam(0.001 * hvd.size())


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        probs = digits_model(images, training=True)
        loss_value = loss(labels, probs)

    # Horovod: add Horovod Distributed GradientTape.
    tape = hvd.DistributedGradientTape(tape)

    grads = tape.gradient(loss_value, digits_model.trainable_variables)
    opt.apply_gradients(zip(grads, digits_model.trainable_variables))

    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    # This is necessary to ensure consistent initialization of all workers when
    # training is started with random weights or restored from a checkpoint.
    #
    # Note: broadcast should be done after the first gradient step to ensure optimizer
    # initialization.
    if first_batch:
        hvd.broadcast_variables(digits_model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables(), root_rank=0)

    return loss_value


# Horovod: adjust number of steps based on number of GPUs.
for batch, (images, labels) in enumerate(dataset.take(400 // hvd.size())):
    loss_value = training_step(images, labels, batch == 0)

    if batch % 100 == 0 and hvd.rank() == 0:
        print("Step #%d\tLoss: %.6f" % (batch, loss_value), flush=True)

predictions = np.argmax(digits_model.predict(x_test, verbose=0), axis=1)
accuracy = hvd.allreduce(tf.constant(np.mean(predictions == y_test)), name="accuracy")
weights = tf.concat([tf.reshape(v, [-1]) for v in digits_model.trainable_variables], axis=0)
every_rank = hvd.allgather(tf.expand_dims(weights, 0))
if hvd.rank() == 0:
    print("Accuracy: %.2f%%" % (100.0 * float(accuracy)), flush=True)
    print("weights identical on all ranks:", bool(np.all(every_rank.numpy() == weights.numpy())), flush=True)
