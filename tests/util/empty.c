/* Keeps hp_test_util non-empty. */
