"""Train a compiled Keras model with ``fit`` running its step rewritten to swap tensors."""

import keras
import numpy as np

import lmscore

x = np.random.rand(1024, 28, 28, 1).astype("float32")
y = np.random.randint(0, 10, 1024)
model = keras.Sequential([
    keras.Input((28, 28, 1)),
    keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.Conv2D(32, 3, activation="relu"),
    keras.layers.Dropout(0.25), keras.layers.Flatten(), keras.layers.Dense(10),
])
model.compile(optimizer="adam", metrics=["accuracy"],
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

lms = lmscore.swap_fit(model, batch_size=64, threshold=2)  # fit now runs the swapped step

model.fit(x, y, batch_size=64, epochs=2, validation_split=0.2, verbose=2)
print("swapped", len(lms.steps[0].plan.swaps), "tensors")
