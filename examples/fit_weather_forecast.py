"""Keras's example "Timeseries forecasting for weather prediction"
(keras.io/examples/timeseries/timeseries_weather_forecasting) with
`model.fit(...)` replaced by `trainer.fit(build, ...)`:

    python examples/fit_weather_forecast.py
    python examples/fit_weather_forecast.py --cpu_devices=2     # 2 replicas
    python scripts/launch_workers.py --num_workers=2 -- \\
        python examples/fit_weather_forecast.py                 # 2 workers

The model's construction and compile moved into `build()`, and `model` comes
back from the History; the rest is the example's: windows of
`timeseries_dataset_from_array`, its EarlyStopping and its best-only
ModelCheckpoint on val_loss. The LSTM has no random layer, so on 2 replicas
and 2 workers it trains as on one device.

The Jena climate record needs a download, so the weather is generated: 2,400
hourly readings of the example's seven features (pressure, temperature,
saturation pressure, vapour pressure deficit, specific humidity, air density,
wind speed) from daily and yearly cycles and noise, the temperature 12 hours
ahead the target. The windows are 3 days of readings every 6 hours (12 steps)
instead of 720 hours every 6, the learning rate 0.01 instead of 0.001.
"""

import keras
import numpy as np

import trainer

"""
## Climate data
"""

hours = np.arange(2400)
rng = np.random.default_rng(7)
day, year = np.sin(2 * np.pi * hours / 24), np.sin(2 * np.pi * hours / 8766)
temperature = 10 + 8 * year + 4 * day + rng.normal(0, 1, hours.size).cumsum() / 20
titles = ["Pressure", "Temperature", "Saturation vapor pressure",
          "Vapor pressure deficit", "Specific humidity", "Airtight", "Wind speed"]
feature_keys = ["p (mbar)", "T (degC)", "VPmax (mbar)", "VPdef (mbar)",
                "sh (g/kg)", "rho (g/m**3)", "wv (m/s)"]
# The example reads these columns of the CSV with pandas; here they are arrays.
columns = {
    "p (mbar)": 990 + 5 * year + rng.normal(0, 2, hours.size),
    "T (degC)": temperature,
    "VPmax (mbar)": 6.1 * np.exp(17.6 * temperature / (temperature + 243)),
    "VPdef (mbar)": 3 + 2 * day + rng.normal(0, 0.5, hours.size),
    "sh (g/kg)": 6 + 2 * year + rng.normal(0, 0.3, hours.size),
    "rho (g/m**3)": 1250 - 4 * temperature + rng.normal(0, 3, hours.size),
    "wv (m/s)": np.abs(2 + rng.normal(0, 1, hours.size)),
}

"""
## Data Preprocessing
"""

split_fraction = 0.715
train_split = int(split_fraction * hours.size)
step = 6

past = 72
future = 12
learning_rate = 0.01
batch_size = 256
epochs = 10


def normalize(data, train_split):
  data_mean = data[:train_split].mean(axis=0)
  data_std = data[:train_split].std(axis=0)
  return (data - data_mean) / data_std


print(
    "The selected parameters are:",
    ", ".join([titles[i] for i in range(len(feature_keys))]),
)
features = np.stack([columns[key] for key in feature_keys], axis=1)
features = normalize(features, train_split).astype("float32")

train_data = features[:train_split]
val_data = features[train_split:]

"""
# Training dataset
"""

start = past + future
end = start + train_split

x_train = train_data[:, :7]
y_train = features[start:end, 1:2]

sequence_length = int(past / step)

dataset_train = keras.preprocessing.timeseries_dataset_from_array(
    x_train,
    y_train,
    sequence_length=sequence_length,
    sampling_rate=step,
    batch_size=batch_size,
)

"""
## Validation dataset
"""

x_end = len(val_data) - past - future

label_start = train_split + past + future

x_val = val_data[:x_end, :7]
y_val = features[label_start:, 1:2]

dataset_val = keras.preprocessing.timeseries_dataset_from_array(
    x_val,
    y_val,
    sequence_length=sequence_length,
    sampling_rate=step,
    batch_size=batch_size,
)


for batch in dataset_train.take(1):
  inputs, targets = batch

print("Input shape:", inputs.numpy().shape)
print("Target shape:", targets.numpy().shape)

"""
## Training
"""


def build():
  inputs_ = keras.layers.Input(shape=(inputs.shape[1], inputs.shape[2]))
  lstm_out = keras.layers.LSTM(32)(inputs_)
  outputs = keras.layers.Dense(1)(lstm_out)

  model = keras.Model(inputs=inputs_, outputs=outputs)
  model.compile(optimizer=keras.optimizers.Adam(learning_rate=learning_rate),
                loss="mse")
  return model


path_checkpoint = "model_checkpoint.weights.h5"
es_callback = keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=0,
                                            patience=5)

modelckpt_callback = keras.callbacks.ModelCheckpoint(
    monitor="val_loss",
    filepath=path_checkpoint,
    verbose=1,
    save_weights_only=True,
    save_best_only=True,
)

history = trainer.fit(
    build,
    dataset_train,
    epochs=epochs,
    validation_data=dataset_val,
    callbacks=[es_callback, modelckpt_callback],
    model_dir="runs/fit_weather_forecast",
)
model = history.model
model.summary()

"""
## Prediction
"""

for x, y in dataset_val.take(5):
  print("Prediction:", float(model.predict(x, verbose=0)[0, 0]),
        "true:", float(y[0, 0]))
