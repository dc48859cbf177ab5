import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/**', 'node_modules/**', 'coverage/**', 'sample-app/.data/**'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      '@typescript-eslint/no-explicit-any': 'error',
      'no-restricted-syntax': [
        'error',
        { selector: "Identifier[name='__dirname']", message: 'Source must stay ESM-clean: use import.meta.url.' },
      ],
    },
  },
  {
    files: ['lib/src/**/*.ts'],
    rules: { 'no-console': 'error' },
  },
);
