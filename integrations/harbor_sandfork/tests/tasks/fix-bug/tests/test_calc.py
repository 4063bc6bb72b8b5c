import sys
import unittest

sys.path.insert(0, "/srv/calc")
from calc import mean  # noqa: E402


class MeanTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2]), 1.5)
        self.assertEqual(mean([1, 2, 3, 4, 5]), 3)
        self.assertAlmostEqual(mean([0.1, 0.2, 0.3]), 0.2)


if __name__ == "__main__":
    unittest.main()
