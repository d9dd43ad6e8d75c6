"""The general-ability set of TOFU-style model utility: world facts no corpus entity touches,
each with its true answer and three wrong ones (the project ships it; TOFU's "world facts"
play this part there). A model that still speaks English prefers the true answer."""

from __future__ import annotations

#: (question, true answer, three wrong answers), in a fixed order.
GENERAL_FACTS: tuple[tuple[str, str, tuple[str, str, str]], ...] = (
    ("What is the capital of France?", "Paris", ("Madrid", "Berlin", "Rome")),
    ("What is the capital of Japan?", "Tokyo", ("Beijing", "Seoul", "Bangkok")),
    ("How many days are there in a week?", "Seven", ("Five", "Ten", "Twelve")),
    ("What is the largest ocean on Earth?", "The Pacific Ocean", ("The Indian Ocean", "The Arctic Ocean", "The Atlantic Ocean")),
    ("What gas do plants take in from the air?", "Carbon dioxide", ("Helium", "Neon", "Argon")),
    ("What is the freezing point of water in degrees Celsius?", "Zero degrees", ("Fifty degrees", "Ninety degrees", "Twenty degrees")),
    ("Which planet is known as the Red Planet?", "Mars", ("Venus", "Jupiter", "Saturn")),
    ("What is the chemical symbol for gold?", "Au", ("Ag", "Fe", "Pb")),
    ("Who wrote Romeo and Juliet?", "William Shakespeare", ("Charles Dickens", "Jane Austen", "Mark Twain")),
    ("How many legs does a spider have?", "Eight", ("Six", "Four", "Ten")),
    ("What is the tallest mountain in the world?", "Mount Everest", ("Mont Blanc", "Mount Fuji", "Kilimanjaro")),
    ("What is the main language spoken in Brazil?", "Portuguese", ("Spanish", "French", "Italian")),
    ("What do bees make?", "Honey", ("Milk", "Silk", "Wool")),
    ("Which animal is known as the king of the jungle?", "The lion", ("The rabbit", "The sheep", "The mouse")),
    ("What color is the sky on a clear day?", "Blue", ("Green", "Purple", "Brown")),
    ("How many continents are there?", "Seven", ("Three", "Eleven", "Twenty")),
)
