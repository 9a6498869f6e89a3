"""A custom training loop under MirroredStrategy on two logical CPUs, swapped per replica."""
import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
import keras  # noqa: E402

import lmscore  # noqa: E402

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    model = keras.Sequential([
        keras.Input((16, 16, 3)), keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.Conv2D(8, 3, activation="relu"), keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(5)])
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")


def replica_step(x, y):
    """One replica's forward, backward and (all-reduced) update on its half of the batch."""
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True)) / 64
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return loss


@tf.function
def train_step(x, y):
    """The data-parallel step: every replica's step, and the summed loss."""
    return strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None)


images = tf.random.stateless_normal([256, 16, 16, 3], seed=[0, 1])
data = tf.data.Dataset.from_tensor_slices((images, tf.range(256) % 5)).batch(64).repeat()
batches = iter(strategy.experimental_distribute_dataset(data))
step = lmscore.swap(train_step, *next(batches), threshold=2)  # one plan per replica
print(step.summary)
for _ in range(3):
    print(float(step(*next(batches))))
