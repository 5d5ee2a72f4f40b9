"""The model and fixed batch both torch peer scripts use (the MLP, or torchvision's `--model`). No toolkit code."""
import torch


def model_and_batch(args):
    """(model, data, target): one fixed random batch of `--batch-size` samples."""
    if args.model == "mlp":
        layers, width = [], args.features
        for _ in range(args.hidden_layers):
            layers += [torch.nn.Linear(width, args.hidden_size), torch.nn.ReLU()]
            width = args.hidden_size
        model = torch.nn.Sequential(*layers, torch.nn.Linear(width, args.classes))
        data = torch.randn(args.batch_size, args.features)
    else:
        import torchvision
        model = getattr(torchvision.models, args.model)(num_classes=args.classes)
        data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    return model, data, torch.randint(0, args.classes, (args.batch_size,))
