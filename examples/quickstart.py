import privfed

config = privfed.TrainConfig(
    dataset="shapes:300", num_clients=3, participation=1.0, rounds=1, local_epochs=1, batch_size=16,
    projection_dim=16, memory_size=32, num_local_centroids=4, num_global_centroids=8, record_releases=True,
)
run = privfed.train(config, out="runs/quickstart")  # 3 simulated clients, kanon releases, SecAgg+
encoder = privfed.load_encoder(run)  # the trained backbone, a torch.nn.Module
print("kNN accuracy:", privfed.evaluate(run, protocol="knn")["accuracy"])
attack = privfed.attack(run, method="decoder", steps=20, max_vectors=8, settings={"views": 1})
print("reconstruction PSNR gain over the null (dB):", attack["rounds"][-1]["advantage_psnr_best_member"])
